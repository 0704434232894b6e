"""TaskStream: an endless, seeded, resumable stream of tasks.

Every task handed out has a global index. Indices are marked done when the
trainer has consumed their group; on resume, any index handed out but not done
(in flight when the run stopped) is handed out again first, so no task is lost
and none is trained twice.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["TaskStream"]


class TaskStream:
    """Yields ``(index, task)`` in epochs, each a fresh seeded permutation.

    Args:
        tasks: The task rows.
        seed: Seed of the permutations.
        shuffle: Permute each epoch (else keep file order).

    Example:
        >>> s = TaskStream([{"q": 1}, {"q": 2}], seed=0, shuffle=False)
        >>> [s.next()[1]["q"] for _ in range(3)]
        [1, 2, 1]
    """

    def __init__(self, tasks: Sequence[Mapping[str, Any]], *, seed: int = 0, shuffle: bool = True):
        if not tasks:
            raise ValueError("the task list is empty")
        self.tasks = list(tasks)
        self.seed = seed
        self.shuffle = shuffle
        self._next = 0
        self._done: set[int] = set()
        self._reissue: list[int] = []
        self._order_cache: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._order_cache:
            order = list(range(len(self.tasks)))
            if self.shuffle:
                random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._order_cache = {epoch: order}
        return self._order_cache[epoch]

    def task(self, index: int) -> Mapping[str, Any]:
        """The task at global index ``index``."""
        epoch, pos = divmod(index, len(self.tasks))
        return self.tasks[self._order(epoch)[pos]]

    def next(self) -> tuple[int, Mapping[str, Any]]:
        """The next task: one to re-issue after a resume first, then new ones."""
        if self._reissue:
            index = self._reissue.pop(0)
        else:
            index = self._next
            self._next += 1
        return index, self.task(index)

    def take(self, n: int) -> list[tuple[int, Mapping[str, Any]]]:
        """The next ``n`` tasks."""
        return [self.next() for _ in range(n)]

    def mark_done(self, indices: Sequence[int]) -> None:
        """Records that these tasks were consumed (trained on, or counted as discarded)."""
        self._done.update(indices)

    @property
    def issued(self) -> int:
        """How many distinct indices were ever handed out."""
        return self._next

    def state_dict(self) -> dict[str, Any]:
        """Resumable position: next index and which handed-out indices were not done."""
        outstanding = sorted(set(range(self._next)) - self._done) + list(self._reissue)
        return {"next": self._next, "outstanding": sorted(set(outstanding)), "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues from :meth:`state_dict`; outstanding tasks are handed out again first."""
        self._next = int(state["next"])
        outstanding = [int(i) for i in state.get("outstanding", [])]
        self._done = set(range(self._next)) - set(outstanding)
        self._reissue = outstanding
