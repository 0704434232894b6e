"""The run doctor: red flags of the minimum dashboard, read from a run's metrics.

Each rule watches one dashboard signal in ``metrics.jsonl`` (the keys the trainer and
driver write: ``reward/mean``, ``kl/ref_kl``, ``actor/entropy`` …) and reports the step
at which the red flag *began*, the failure mode it points to and the levers to pull.
``agentrl doctor run RUN_DIR`` prints them after the fact; :class:`LiveDoctor` prints
each flag the first time it appears while a run trains.

Example:
    >>> flags = diagnose([{"step": s, "reward/mean": 0.0} for s in range(1, 9)])
    >>> flags[0].name, flags[0].step
    ('reward_flat_zero', 1)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentrl.reporting.dashboard import FAILURE_MODES, RULES, Flag, Rule, finite_number

__all__ = [
    "FAILURE_MODES",
    "RULES",
    "Flag",
    "LiveDoctor",
    "Rule",
    "diagnose",
    "read_metrics",
    "unchecked",
]


def _split(
    rows: Iterable[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    train: list[Mapping[str, Any]] = []
    evals: list[Mapping[str, Any]] = []
    for r in rows:
        if finite_number(r.get("step")) is None:
            continue
        (evals if r.get("kind") == "eval" else train).append(r)
    train.sort(key=lambda r: r["step"])
    evals.sort(key=lambda r: r["step"])
    return train, evals


def diagnose(rows: Iterable[Mapping[str, Any]]) -> list[Flag]:
    """Every red flag in a run's metric rows (``kind`` "eval" rows are evaluations).

    Returns:
        The flags, ordered by the step they began at.
    """
    train, evals = _split(rows)
    flags = []
    for rule in RULES:
        hit = rule.check(train, evals)
        if hit is not None:
            flags.append(Flag(rule.name, int(hit[0]), rule.failure_mode, hit[1], rule.levers))
    return sorted(flags, key=lambda f: f.step)


def unchecked(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Rules whose metrics never appear in ``rows`` (e.g. KL without a reference model)."""
    present = {k for r in rows for k, v in r.items() if finite_number(v) is not None}
    return [rule.name for rule in RULES if not present.intersection(rule.keys)]


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``RUN_DIR/metrics.jsonl``.

    Raises:
        FileNotFoundError: No metrics.jsonl (the message names the path).
        ValueError: A line that is not JSON (named by its number).
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file {path} (is {run_dir} a run directory?)")
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i} is not JSON: {e}") from None
    return rows


class LiveDoctor:
    """Feeds a training run's metrics to :func:`diagnose`; returns each flag once.

    Example:
        >>> doc = LiveDoctor()
        >>> new = doc.step(1, {"reward/mean": 0.0})
    """

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.seen: set[str] = set()

    def _new(self) -> list[Flag]:
        out = [f for f in diagnose(self.rows) if f.name not in self.seen]
        self.seen.update(f.name for f in out)
        return out

    def step(self, step: int, metrics: Mapping[str, Any]) -> list[Flag]:
        """Adds a training step's metrics; returns the flags that appear for the first time."""
        self.rows.append({**metrics, "step": step, "kind": "train"})
        return self._new()

    def eval(self, step: int, metrics: Mapping[str, Any]) -> list[Flag]:
        """Adds an evaluation's metrics; returns the flags that appear for the first time."""
        self.rows.append({**metrics, "step": step, "kind": "eval"})
        return self._new()
