"""The engine: Trainer, actor, networks, data parallel, update, batches, memory, checkpoints."""
