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
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.reporting.dashboard import FAILURE_MODES, RULES, Flag, Rule, finite_number

__all__ = [
    "FAILURE_MODES",
    "RULES",
    "Flag",
    "LiveDoctor",
    "Rule",
    "check",
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


def check(
    rule: Rule, train: Sequence[Mapping[str, Any]], evals: Sequence[Mapping[str, Any]]
) -> Flag | None:
    """``rule``'s flag on rows already split and sorted by step (:func:`diagnose`), or None."""
    hit = rule.check(train, evals)
    if hit is None:
        return None
    return Flag(rule.name, int(hit[0]), rule.failure_mode, hit[1], rule.levers)


def diagnose(rows: Iterable[Mapping[str, Any]]) -> list[Flag]:
    """Every red flag in a run's metric rows (``kind`` "eval" rows are evaluations).

    Returns:
        The flags, ordered by the step they began at.
    """
    train, evals = _split(rows)
    flags = [f for rule in RULES if (f := check(rule, train, evals)) is not None]
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


# The most first rows any rule reads as its baseline.
_BASELINE = max(rule.baseline for rule in RULES)


class LiveDoctor:
    """Feeds a training run's metrics to the rules of :func:`diagnose`; returns each flag once.

    It keeps, of each kind (train, eval), the first ``head`` rows and the last ``tail``, so
    its memory and the time of a step's check stay flat over a run of any length (keeping
    every row grew the driver ~2.5 KiB a step, and each step's check took O(steps)). Each
    rule reads its ``baseline`` first rows and the tail: the rows it compares one after
    another are consecutive steps, and a flag is reported the step it becomes visible,
    while its rows are in the tail. ``agentrl doctor run`` reads the whole file.

    Example:
        >>> doc = LiveDoctor()
        >>> new = doc.step(1, {"reward/mean": 0.0})
    """

    def __init__(self, head: int = _BASELINE, tail: int = 256) -> None:
        self.head, self.tail = head, tail
        self._first: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}
        self._last: dict[str, deque[dict[str, Any]]] = {
            k: deque(maxlen=tail) for k in ("train", "eval")
        }
        self._dropped = {"train": False, "eval": False}
        self.seen: set[str] = set()

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The rows kept: the first ``head`` and the last ``tail`` of each kind."""
        return [r for k in ("train", "eval") for r in (*self._first[k], *self._last[k])]

    def _kept(self, kind: str, baseline: int) -> list[dict[str, Any]]:
        first = self._first[kind]
        rows = [*(first[:baseline] if self._dropped[kind] else first), *self._last[kind]]
        return sorted(rows, key=lambda r: r["step"])

    def _add(self, kind: str, step: int, metrics: Mapping[str, Any]) -> list[Flag]:
        if finite_number(step) is None:
            return []
        row = {**metrics, "step": step, "kind": kind}
        if len(self._first[kind]) < self.head:
            self._first[kind].append(row)
        else:
            last = self._last[kind]
            self._dropped[kind] |= len(last) == last.maxlen
            last.append(row)
        out = []
        todo = [rule for rule in RULES if rule.name not in self.seen]
        # The rows each baseline reads, built once a step (not once a rule).
        kept = {
            b: (self._kept("train", b), self._kept("eval", b)) for b in {r.baseline for r in todo}
        }
        for rule in todo:
            flag = check(rule, *kept[rule.baseline])
            if flag is not None:
                self.seen.add(rule.name)
                out.append(flag)
        return sorted(out, key=lambda f: f.step)

    def step(self, step: int, metrics: Mapping[str, Any]) -> list[Flag]:
        """Adds a training step's metrics; returns the flags that appear for the first time."""
        return self._add("train", step, metrics)

    def eval(self, step: int, metrics: Mapping[str, Any]) -> list[Flag]:
        """Adds an evaluation's metrics; returns the flags that appear for the first time."""
        return self._add("eval", step, metrics)
