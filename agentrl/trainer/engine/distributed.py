"""Data parallelism: FSDP2 sharding inside a worker, and a launcher of N worker processes.

Every worker receives the whole batch, computes the same advantages, and takes its
length-balanced share of each mini-batch; FSDP2 (``fully_shard``) shards parameters,
gradients and optimizer state and averages gradients (gloo on CPU, NCCL on GPU).
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agentrl.trainer.engine.sharding import shard_module
from agentrl.types import Trajectory

__all__ = ["DataParallelTrainer", "free_port", "shard_module"]


def free_port() -> int:
    """A TCP port free on this host right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(
    rank: int,
    world: int,
    port: int,
    config_json: str,
    model: str,
    backend: str,
    cmds: Any,
    results: Any,
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    from agentrl.trainer.config import TrainerConfig
    from agentrl.trainer.engine.trainer import Trainer

    try:
        trainer = Trainer(TrainerConfig.model_validate_json(config_json), model)
        results.put((rank, "ready", None))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        return
    while True:
        name, args, kwargs = cmds.get()
        if name == "close":
            break
        try:
            out = getattr(trainer, name)(*args, **kwargs)
            results.put((rank, "ok", out if rank == 0 else None))
        except BaseException as e:
            results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    dist.destroy_process_group()


class DataParallelTrainer:
    """Runs a ``Trainer`` in N worker processes (torch.multiprocessing spawn).

    Same methods as ``Trainer`` (step, save_checkpoint, load_checkpoint,
    state_dict_for_inference, save_hf); results come from worker 0.

    Args:
        config: The trainer configuration.
        model: A HF model directory or hub id (workers load it themselves).
        world_size: Number of workers.
        backend: "gloo" or "nccl"; default NCCL when CUDA has ≥ world_size GPUs.
        timeout_s: How long to wait for any one command.
    """

    def __init__(
        self,
        config: Any,
        model: str | Path,
        world_size: int,
        *,
        backend: str | None = None,
        timeout_s: float = 3600.0,
    ) -> None:
        if backend is None:
            backend = "nccl" if torch.cuda.device_count() >= world_size else "gloo"
        self.world_size = world_size
        self.timeout_s = timeout_s
        ctx = mp.get_context("spawn")
        self._cmds = [ctx.Queue() for _ in range(world_size)]
        self._results = ctx.Queue()
        port = free_port()
        self._procs = [
            ctx.Process(
                target=_worker,
                args=(
                    r,
                    world_size,
                    port,
                    config.model_dump_json(),
                    str(model),
                    backend,
                    self._cmds[r],
                    self._results,
                ),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in self._procs:
            p.start()
        self._collect()

    def _collect(self) -> Any:
        out: dict[int, tuple[str, Any]] = {}
        waited = 0.0
        while len(out) < self.world_size:
            try:
                rank, status, payload = self._results.get(timeout=5.0)
                out[rank] = (status, payload)
            except queue.Empty:
                waited += 5.0
                dead = [i for i, p in enumerate(self._procs) if not p.is_alive() and i not in out]
                if dead or waited > self.timeout_s:
                    self.close()
                    raise RuntimeError(
                        f"data-parallel workers {dead or 'timed out'} stopped answering"
                    ) from None
        errors = [f"worker {r}: {p}" for r, (s, p) in sorted(out.items()) if s == "error"]
        if errors:
            raise RuntimeError("\n".join(errors))
        return out[0][1]

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        for q in self._cmds:
            q.put((name, args, kwargs))
        return self._collect()

    def step(self, trajectories: Sequence[Trajectory], **kwargs: Any) -> dict[str, float]:
        """One trainer step on all workers; returns worker 0's metrics."""
        return self._call("step", list(trajectories), **kwargs)

    def save_checkpoint(
        self, root: str | Path | None = None, extra: dict[str, Any] | None = None
    ) -> Path:
        return self._call("save_checkpoint", root, extra)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        return self._call("load_checkpoint", path)

    def state_dict_for_inference(self) -> dict[str, torch.Tensor]:
        return self._call("state_dict_for_inference")

    def save_hf(self, out_dir: str | Path) -> Path:
        return self._call("save_hf", out_dir)

    def call(self, fn: Callable[..., Any] | str, *args: Any) -> Any:
        """Calls a Trainer method by name on every worker (e.g. 'global_step')."""
        return self._call(fn if isinstance(fn, str) else fn.__name__, *args)

    def close(self) -> None:
        """Stops the workers."""
        for q in self._cmds:
            with contextlib.suppress(OSError, ValueError):
                q.put(("close", (), {}))
        for p in self._procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()

    def __enter__(self) -> DataParallelTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
