"""Task validation: the gold patch must pass the hidden tests and the empty patch must fail.

    python -m agentrl.envs.swe.validate [--tasks PATH | --level tiny|small [--seed S]]
                                        [--task ID ...] [--jobs N]

Without ``--tasks`` or ``--level`` the built-in set is checked; ``--level`` checks both
splits of a generated level (:mod:`agentrl.envs.swe.ladder`). Each failing task is printed with its
id and what failed; the exit status is 1 if any task failed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from agentrl.sandbox.base import SandboxError

from .grader import Grader, GraderError, GradeResult
from .ladder import generate_tasks
from .loader import builtin_tasks, load_tasks
from .task import SweTask, TaskFormatError

__all__ = [
    "TaskValidationError",
    "ValidationResult",
    "check_all",
    "main",
    "validate_task",
    "validate_tasks",
]


class TaskValidationError(RuntimeError):
    """One or more tasks failed validation; the message names each and what failed."""


@dataclass(frozen=True)
class ValidationResult:
    """The validation of one task.

    Attributes:
        task_id: The task.
        problems: What failed (empty: the task is valid).
        gold: The gold patch's grade (None if grading raised).
        empty: The empty patch's grade (None if grading raised).
        duration_s: Wall time of both gradings.
    """

    task_id: str
    problems: tuple[str, ...]
    gold: GradeResult | None = None
    empty: GradeResult | None = None
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def message(self) -> str:
        """One line per problem, each naming the task."""
        if self.ok:
            return f"{self.task_id}: ok"
        return "\n".join(f"{self.task_id}: {p}" for p in self.problems)


async def _grade(grader: Grader, task: SweTask, patch: str, which: str) -> GradeResult | str:
    try:
        return await grader.grade(task, patch)
    except (GraderError, SandboxError, RuntimeError) as e:
        return f"grading the {which} patch raised {type(e).__name__}: {e}"


async def validate_task(task: SweTask, grader: Grader | None = None) -> ValidationResult:
    """Grades the gold patch (must pass) and the empty patch (must fail) of ``task``."""
    grader = grader or Grader()
    t0 = time.perf_counter()
    problems: list[str] = []
    gold = await _grade(grader, task, task.gold_patch, "gold")
    empty = await _grade(grader, task, "", "empty")
    if isinstance(gold, str):
        problems.append(gold)
    elif not gold.passed:
        tail = gold.output.strip()[-800:]
        problems.append(f"the gold patch does not pass the hidden tests ({gold.detail}):\n{tail}")
    if isinstance(empty, str):
        problems.append(empty)
    elif empty.passed:
        problems.append("the empty patch passes the hidden tests: they do not test the issue")
    return ValidationResult(
        task.id,
        tuple(problems),
        gold if isinstance(gold, GradeResult) else None,
        empty if isinstance(empty, GradeResult) else None,
        time.perf_counter() - t0,
    )


async def validate_tasks(
    tasks: Sequence[SweTask], *, grader: Grader | None = None, concurrency: int = 3
) -> list[ValidationResult]:
    """Validates ``tasks``, ``concurrency`` at a time; results in the tasks' order."""
    grader = grader or Grader()
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(t: SweTask) -> ValidationResult:
        async with sem:
            return await validate_task(t, grader)

    return list(await asyncio.gather(*(one(t) for t in tasks)))


async def check_all(
    tasks: Sequence[SweTask], *, grader: Grader | None = None, concurrency: int = 3
) -> list[ValidationResult]:
    """Like :func:`validate_tasks`, but raises TaskValidationError naming every bad task."""
    results = await validate_tasks(tasks, grader=grader, concurrency=concurrency)
    bad = [r for r in results if not r.ok]
    if bad:
        raise TaskValidationError(
            f"{len(bad)} of {len(results)} SWE tasks failed validation:\n"
            + "\n".join(r.message() for r in bad)
        )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.envs.swe.validate")
    parser.add_argument("--tasks", help="task file or folder (default: the built-in set)")
    parser.add_argument("--level", choices=["tiny", "small"], help="a generated level")
    parser.add_argument("--seed", type=int, default=0, help="the generated level's seed")
    parser.add_argument("--task", action="append", default=[], help="only this id (repeatable)")
    parser.add_argument("--jobs", type=int, default=3, help="tasks validated at once")
    args = parser.parse_args(argv)
    try:
        if args.tasks and args.level:
            raise TaskFormatError("give --tasks or --level, not both")
        if args.level:
            tasks = [
                t
                for split in ("train", "test")
                for t in generate_tasks(split, seed=args.seed, level=args.level)
            ]
        else:
            tasks = load_tasks(args.tasks) if args.tasks else builtin_tasks()
    except (TaskFormatError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.task:
        unknown = sorted(set(args.task) - {t.id for t in tasks})
        if unknown:
            print(f"error: unknown task id(s) {unknown}", file=sys.stderr)
            return 1
        tasks = [t for t in tasks if t.id in args.task]
    t0 = time.perf_counter()
    results = asyncio.run(validate_tasks(tasks, concurrency=args.jobs))
    for r in results:
        print(r.message() if not r.ok else f"{r.task_id}: ok ({r.duration_s:.1f}s)")
    bad = sum(not r.ok for r in results)
    print(f"{len(results) - bad}/{len(results)} tasks valid in {time.perf_counter() - t0:.1f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
