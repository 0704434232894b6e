"""A run keeps its start-up heap out of the cyclic collector (agentrl/orchestration/heap.py).

The run is the real ``drive`` loop with an in-process policy and a counting trainer
(tests/helpers/drive.py, shared with ``test_resume_consistency``).
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from agentrl.orchestration.heap import frozen_heap
from agentrl.orchestration.startup import ComponentError
from tests.helpers.drive import CountingTrainer, run_drive


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_frozen_heap_keeps_collections_off_the_objects_alive_at_entry() -> None:
    assert gc.get_freeze_count() == 0
    old = _Cycle()
    with frozen_heap():
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # the interpreter's modules, classes, functions…
        assert not any(o is old for o in gc.get_objects())  # no generation walks it
        young = weakref.ref(_Cycle())  # garbage made during the block is still collected
        gc.collect()
        # The collection leaves the frozen objects frozen; a few of them may die meanwhile
        # (refcounts still free them), e.g. as another thread of the test process moves on.
        assert young() is None and frozen - 100 <= gc.get_freeze_count() <= frozen
    assert gc.get_freeze_count() == 0  # back in the oldest generation
    assert any(o is old for o in gc.get_objects(generation=2))


def test_frozen_heap_unfreezes_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("mode", ["sync", "fully_async"])
def test_a_run_freezes_the_start_up_heap_while_it_trains_and_not_after(
    tmp_path: Path, tokenizer, mode: str
) -> None:
    seen: list[int] = []
    result, _ = run_drive(
        tmp_path, tokenizer, CountingTrainer(), mode=mode, steps=3, resume=False,
        on_step=lambda step, metrics: seen.append(gc.get_freeze_count()),
    )  # fmt: skip
    assert result.steps_done == 3 and len(seen) == 3
    assert min(seen) > 1000, seen
    assert gc.get_freeze_count() == 0


def test_a_run_that_fails_leaves_the_heap_unfrozen(tmp_path: Path, tokenizer) -> None:
    with pytest.raises(ComponentError, match="weight sync failed"):
        trainer = CountingTrainer()
        run_drive(tmp_path, tokenizer, trainer, mode="sync", steps=3, resume=False, fail_push=1)
    assert gc.get_freeze_count() == 0
