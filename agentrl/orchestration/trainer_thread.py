"""The run's trainer behind one thread of its own, pinned to ``trainer.cpus``.

The driver's event loop runs the rollout side of a training process: the agent loops,
the envs, the tool calls and the local sandboxes they start. With ``rollout.cpus`` that
loop is pinned to CPUs of its own, and every trainer call (built, stepped, saved) runs
on one :class:`~agentrl.runtime.cpus.PinnedThread` pinned to ``trainer.cpus``, so the two sides
no longer take CPU time from each other: on 2 cores the server and the rollout side
share CPU 0 and the trainer has CPU 1 to itself (``benchmarks/async_real.py``).

Example:
    >>> from agentrl.runtime.cpus import PinnedThread
    >>> class Counter:
    ...     def step(self, trajectories):
    ...         return {"n": float(len(trajectories))}
    >>> t = ThreadedTrainer(Counter(), PinnedThread([]))
    >>> t.step([1, 2])
    {'n': 2.0}
    >>> t.close()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.runtime.cpus import PinnedThread
from agentrl.types import Trajectory

__all__ = ["ThreadedTrainer"]


class ThreadedTrainer:
    """Forwards the calls a run makes of its trainer to ``thread``.

    Callers keep calling it off the event loop (``asyncio.to_thread``); each call then
    waits for the trainer's own thread, one call at a time, in the order they came.
    """

    def __init__(self, trainer: Any, thread: PinnedThread) -> None:
        self.trainer = trainer
        self.thread = thread

    def step(self, trajectories: list[Trajectory], **kwargs: Any) -> dict[str, float]:
        return self.thread.call(self.trainer.step, trajectories, **kwargs)

    def state_dict_for_inference(self) -> dict[str, Any]:
        return self.thread.call(self.trainer.state_dict_for_inference)

    def save_checkpoint(
        self, root: str | Path | None = None, extra: dict[str, Any] | None = None
    ) -> Path:
        return self.thread.call(self.trainer.save_checkpoint, root, extra=extra)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        return self.thread.call(self.trainer.load_checkpoint, path)

    def save_hf(self, out_dir: str | Path) -> Path:
        return self.thread.call(self.trainer.save_hf, out_dir)

    def save_adapter(self, out_dir: str | Path) -> Path:
        return self.thread.call(self.trainer.save_adapter, out_dir)

    def adapter_state_for_inference(self) -> dict[str, Any]:
        return self.thread.call(self.trainer.adapter_state_for_inference)

    def close(self) -> None:
        """Ends the trainer's thread once its current call returns. Idempotent."""
        self.thread.close()
