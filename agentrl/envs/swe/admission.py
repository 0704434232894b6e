"""Admitting a run's SWE tasks (``tasks=PATH``): each snapshot fits the agent's container,
and each task is valid (its gold patch passes its hidden tests, the empty patch fails them).

:meth:`SweEnv.load_tasks <agentrl.envs.swe.env.SweEnv.load_tasks>` calls :func:`admit`, so
a run refuses bad tasks at load, naming every bad id, before any server starts. Validation
grades each task twice with the real grader (about 2 s per task, :data:`JOBS` at once); a
task that passed is remembered by its content (``<agentrl cache>/swe-validated/``), so the
next run loading it grades nothing. ``AGENTRL_SWE_VALIDATE=0`` skips the grading (the size
check stays). The built-in set and the generated levels never come through here (``make
test`` validates them).

Example::

    tasks = admit(load_tasks("my_tasks/"), max_disk_mb=512)  # TaskFormatError naming bad ids
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

from .grader import Grader
from .task import SweTask, TaskFormatError

__all__ = ["JOBS", "SKIP_ENV", "ValidationCache", "admit", "check_size", "snapshot_bytes"]

SKIP_ENV = "AGENTRL_SWE_VALIDATE"
"""``0`` skips grading tasks at load (the format and size checks stay)."""
JOBS = 3
"""Tasks validated at once at load."""
_MIB = 1 << 20
_VERSION = b"swe-validated-1"  # bump when the grader's verdict on a task may change
_T = TypeVar("_T")


def snapshot_bytes(task: SweTask) -> int | None:
    """Bytes of the task's snapshot (None when it lives in an image: checked at install)."""
    if task.repo_files is not None:
        return sum(len(c.encode()) for c in task.repo_files.values())
    if task.repo_dir is not None:
        root = Path(task.repo_dir)
        return sum((root / p).stat().st_size for p in task.snapshot_paths() or ())
    return None


def check_size(task: SweTask, max_disk_mb: int, *, setting: str = "limits.max_disk_mb") -> None:
    """Raises TaskFormatError naming the task, its size and ``setting`` when the snapshot
    is over half the agent container's disk (git's copy of it needs the other half)."""
    size, cap = snapshot_bytes(task), max_disk_mb * _MIB // 2
    if size is not None and size > cap:
        raise TaskFormatError(
            f"SWE task {task.id!r}: its snapshot holds {size / _MIB:.1f} MiB, over the "
            f"{cap / _MIB:.1f} MiB a task may hold: half the agent container's disk "
            f"(SweEnv {setting}={max_disk_mb}; git's copy of the snapshot needs the other "
            "half). Make the repository smaller or give SweEnv limits with a larger max_disk_mb"
        )


class ValidationCache:
    """Tasks that passed validation, remembered by their content (and image) as empty files."""

    def __init__(self, root: str | Path | None = None) -> None:
        if root is None:
            from agentrl.models.tiny import cache_root

            root = cache_root() / "swe-validated"
        self.root = Path(root)

    @staticmethod
    def key(task: SweTask) -> str:
        """A digest of everything the verdict depends on: the row, the snapshot, the image."""
        from agentrl.sandbox.images import image_tag

        h = hashlib.sha256(_VERSION)
        row = {k: v for k, v in task.to_row().items() if k != "repo_dir"}
        h.update(json.dumps(row, sort_keys=True).encode())
        h.update((task.image or image_tag("python")).encode())
        for path, data in sorted(task.snapshot_files().items()):
            h.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
        return h.hexdigest()

    def has(self, task: SweTask) -> bool:
        return (self.root / self.key(task)).is_file()

    def add(self, task: SweTask) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / self.key(task)).touch()


def _run(make: Callable[[], Awaitable[_T]]) -> _T:
    """Runs a coroutine to its end from sync code, in a thread when a loop is running here
    (a run loads its tasks from inside its event loop, before anything else runs)."""

    async def main() -> _T:
        return await make()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="swe-validate") as ex:
        return ex.submit(asyncio.run, main()).result()


async def validate_new(
    tasks: Sequence[SweTask],
    *,
    grader: Grader | None = None,
    cache: ValidationCache | None = None,
    jobs: int = JOBS,
) -> int:
    """Validates the tasks ``cache`` does not hold yet; how many it graded.

    Raises:
        TaskFormatError: One or more tasks failed, naming each and what failed.
        DockerUnavailableError: No Docker engine answers (one message, not one per task).
    """
    from agentrl.sandbox.images import docker_client

    todo = [t for t in tasks if cache is None or not cache.has(t)]
    if not todo:
        return 0
    await asyncio.to_thread(docker_client)  # no engine: one message, before any grading
    print(
        f"validating {len(todo)} SWE task(s) with the grader (gold patch must pass, empty "
        f"patch must fail; {len(tasks) - len(todo)} validated before); {SKIP_ENV}=0 skips",
        file=sys.stderr,
        flush=True,
    )
    from .validate import validate_tasks  # here: `python -m ...validate` imports this package

    results = await validate_tasks(todo, grader=grader or Grader(), concurrency=jobs)
    bad = []
    for task, r in zip(todo, results, strict=True):
        if r.ok and cache is not None:
            cache.add(task)
        elif not r.ok:
            bad += [f"  {r.task_id}: {p.splitlines()[0].rstrip(':')}" for p in r.problems]
    if bad:
        n = len({r.task_id for r in results if not r.ok})
        raise TaskFormatError(
            f"{n} of {len(tasks)} SWE tasks failed validation, so the run would train on "
            "tasks whose reward does not measure the fix:\n" + "\n".join(bad) + "\n"
            "fix or remove them (python -m agentrl.envs.swe.validate --tasks PATH shows the "
            f"test output); {SKIP_ENV}=0 skips this check"
        )
    return len(todo)


def admit(
    tasks: Sequence[SweTask],
    *,
    max_disk_mb: int,
    validate: bool | None = None,
    grader: Grader | None = None,
    cache: ValidationCache | None = None,
) -> list[SweTask]:
    """``tasks`` if each fits ``max_disk_mb`` (:func:`check_size`) and, with ``validate``
    (default: unless ``AGENTRL_SWE_VALIDATE=0``), passes validation (cached by content).

    Raises:
        TaskFormatError: A snapshot too large, or tasks failing validation (every id named).
    """
    for t in tasks:
        check_size(t, max_disk_mb)
    if validate is None:
        validate = os.environ.get(SKIP_ENV, "1").strip() != "0"
    if validate:
        store = cache or ValidationCache()
        _run(lambda: validate_new(tasks, grader=grader, cache=store))
    return list(tasks)
