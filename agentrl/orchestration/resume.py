"""Crash-consistent checkpoints of a run, and resuming from them.

A run checkpoint holds the trainer's state together with the run's state (step
number, task-stream position) of the *same* step: the driver counts a step (its
tasks done, the step number moved) right after the trainer's update, and a
checkpoint is never taken while an update is half-applied. On resume the run's
logs are rewound to the checkpoint's step, so every step number appears once in
``metrics.jsonl`` and ``tasks.jsonl`` whatever killed the previous process.

``tasks.jsonl`` has one line per step: ``{"step": N, "tasks": [stream indices]}``
(the task indices the step consumed, trained or discarded), so a test or a user
can check that no task is trained twice or lost across a crash.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.errors import ComponentError
from agentrl.orchestration.driver import Driver, StepOutput
from agentrl.reporting.run_dir import RunDir
from agentrl.trainer.engine.checkpoint import CheckpointError, select_checkpoint

__all__ = [
    "TASKS_FILE",
    "find_resume_checkpoint",
    "log_tasks",
    "rewind_logs",
    "save_run_checkpoint",
]

TASKS_FILE = "tasks.jsonl"
SUPERSEDED = "superseded.jsonl"


def find_resume_checkpoint(run_path: Path, say: Callable[[str], None]) -> Path:
    """The checkpoint ``--resume RUN_DIR`` continues from (newest good one).

    Raises:
        ComponentError: No such run directory, or no good checkpoint in it (named).
    """
    if not run_path.is_dir():
        raise ComponentError(f"--resume {run_path}: no such run directory")
    try:
        return select_checkpoint(run_path / "checkpoints", say)
    except CheckpointError as e:
        raise ComponentError(
            f"--resume {run_path}: cannot resume, {e}; start a new run without --resume"
        ) from e


def save_run_checkpoint(
    trainer: Any, run: RunDir, driver: Driver, extra: dict[str, Any] | None = None
) -> Path:
    """Saves the trainer with the run state of the same step (``extra['run']``)."""
    if driver.training:
        raise RuntimeError("no checkpoint while the trainer is mid-update")
    state = {"step": driver.step, "stream": driver.stream.state_dict(), **(extra or {})}
    return Path(trainer.save_checkpoint(run.checkpoints, extra={"run": state}))


def log_tasks(run: RunDir, out: StepOutput) -> None:
    """Appends the step's consumed task indices to ``tasks.jsonl``."""
    with (run.path / TASKS_FILE).open("a") as f:
        f.write(json.dumps({"step": out.step, "tasks": out.tasks}) + "\n")


def _split(path: Path, keep: Callable[[dict[str, Any]], bool]) -> list[str]:
    """Keeps the lines of a JSONL file that ``keep`` accepts (atomically); returns the rest."""
    if not path.is_file():
        return []
    kept: list[str] = []
    dropped: list[str] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            ok = keep(json.loads(line))
        except ValueError:  # a line cut short by the kill
            ok = False
        (kept if ok else dropped).append(line)
    if dropped:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(x + "\n" for x in kept))
        tmp.replace(path)
    return dropped


def rewind_logs(run: RunDir, step: int, say: Callable[[str], None]) -> None:
    """Moves log lines of steps after ``step`` (logged, never checkpointed) aside.

    They go to ``superseded.jsonl`` (nothing is deleted); the resumed run logs
    those steps again.
    """
    dropped = _split(run.metrics_file, lambda m: int(m.get("step", 0)) <= step)
    dropped += _split(run.path / TASKS_FILE, lambda m: int(m.get("step", 0)) <= step)
    if dropped:
        with (run.path / SUPERSEDED).open("a") as f:
            f.write("".join(x + "\n" for x in dropped))
        say(
            f"{len(dropped)} log lines of steps after {step} (not in the checkpoint) "
            f"moved to {SUPERSEDED}"
        )
