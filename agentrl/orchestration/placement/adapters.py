"""Adapters that let the unchanged :class:`~agentrl.orchestration.driver.Driver` use Ray actors.

* :class:`RayRolloutRunner` has ``group_size`` and ``run_group`` and sends each group
  to the least-busy rollout worker (re-sending it if that worker died);
* :class:`RayTrainer` has ``step``, ``state_dict_for_inference``, checkpoints and
  ``save_hf``, blocking on the trainer workers (the Driver calls it in a thread);
* :class:`WeightsRef` carries the trainer's weights as an object-store reference, so
  they go from the trainer's node to the replicas' nodes without the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import ray

from agentrl.types import Trajectory

__all__ = ["RayRolloutRunner", "RayTrainer", "WeightsRef", "await_refs"]

log = logging.getLogger(__name__)


async def await_refs(ref: Any, timeout_s: float) -> Any:
    """Awaits an ObjectRef (or a list of them) with a timeout; cancels on timeout."""
    refs = ref if isinstance(ref, list) else [ref]
    futs = [asyncio.wrap_future(r.future()) for r in refs]
    try:
        out = await asyncio.wait_for(asyncio.gather(*futs), timeout_s)
    except TimeoutError:
        for r in refs:
            with contextlib.suppress(Exception):
                ray.cancel(r)
        raise
    return out if isinstance(ref, list) else out[0]


class WeightsRef(dict[str, Any]):
    """Stands for a state dict that stays in Ray's object store (empty as a dict).

    :meth:`RayTrainer.state_dict_for_inference` returns one so the weights go from
    the trainer's node to the replicas' nodes without passing through the driver.
    """

    def __init__(self, ref: Any) -> None:
        super().__init__()
        self.ref = ref


class RayTrainer:
    """The Driver's trainer: calls every trainer worker, returns rank 0's result.

    Args:
        workers: Trainer worker actors, rank order.
        timeout_s: Timeout of one call.
    """

    def __init__(self, workers: Sequence[Any], timeout_s: float) -> None:
        self.workers = list(workers)
        self.timeout_s = timeout_s

    def _all(self, method: str, *args: Any) -> Any:
        refs = [getattr(w, method).remote(*args) for w in self.workers]
        return ray.get(refs, timeout=self.timeout_s)[0]

    def step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One training step on every worker (the batch goes through the object store once)."""
        return dict(self._all("step", ray.put(list(trajectories))))

    def state_dict_for_inference(self) -> WeightsRef:
        """Gathers the full weights on rank 0 and returns a handle to them (not the tensors)."""
        refs = [w.state_dict_for_inference.remote() for w in self.workers]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=self.timeout_s, fetch_local=False)
        if len(done) < len(refs):
            raise TimeoutError(f"trainer workers did not gather weights in {self.timeout_s:.0f}s")
        ray.get(refs[1:], timeout=self.timeout_s)  # surfaces errors of other ranks
        return WeightsRef(refs[0])

    def weights_checksum(self) -> str:
        """SHA-256 of the policy parameters (rank 0's shard under FSDP)."""
        return str(self._all("weights_checksum"))

    def save_checkpoint(self, root: Any = None, extra: dict[str, Any] | None = None) -> str:
        """Saves a checkpoint (on the trainer nodes' filesystem); returns its directory."""
        return str(self._all("save_checkpoint", None if root is None else str(root), extra))

    def load_checkpoint(self, path: Any) -> dict[str, Any]:
        """Resumes every worker; returns the caller's ``extra``."""
        return dict(self._all("load_checkpoint", str(path)))

    def save_hf(self, out_dir: Any) -> str:
        """Writes a plain HF model directory (rank 0's node)."""
        return str(self._all("save_hf", str(out_dir)))


class RayRolloutRunner:
    """The Driver's runner: each group goes to the rollout worker with the fewest in flight.

    Args:
        workers: Rollout worker actors.
        group_size: Episodes per task.
        timeout_s: Timeout of one group.
        max_retries: Times a group is re-sent after its worker died.
    """

    def __init__(
        self, workers: Sequence[Any], group_size: int, timeout_s: float, max_retries: int = 2
    ) -> None:
        self.workers = list(workers)
        self.group_size = group_size
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.in_flight = [0] * len(self.workers)
        self.sent = [0] * len(self.workers)
        self.dead: set[int] = set()

    def _pick(self) -> int:
        alive = [i for i in range(len(self.workers)) if i not in self.dead]
        if not alive:
            raise RuntimeError("every rollout worker has died")
        return min(alive, key=lambda i: (self.in_flight[i], self.sent[i], i))

    async def run_group(
        self, task: Mapping[str, Any], *, index: int, seed: int | None = 0, tag: str = ""
    ) -> list[Trajectory]:
        """Runs one group on a worker; see :meth:`RolloutWorker.run_group`."""
        attempt = 0
        while True:
            i = self._pick()
            self.in_flight[i] += 1
            self.sent[i] += 1
            try:
                ref = self.workers[i].run_group.remote(dict(task), index, seed, tag)
                return list(await await_refs(ref, self.timeout_s))
            except ray.exceptions.RayActorError:
                self.dead.add(i)
                if attempt >= self.max_retries:
                    raise
                attempt += 1
                log.warning("rollout worker %d died; re-sending group %d", i, index)
            finally:
                self.in_flight[i] -= 1
