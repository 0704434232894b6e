"""A training run: startup, the driver loop, evaluation, resume, the trainer process, RFT."""
