"""One machine-readable line per headline figure, for ``make bench``'s summary table.

A benchmark calls :func:`report` beside its human output; it prints
``BENCH-RESULT {json}`` on stdout, which ``benchmarks/run_all.py`` collects from
each benchmark's subprocess into one table (value, target, value/target, PASS or
SHORT) and a JSON file.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import TextIO

PREFIX = "BENCH-RESULT "


class Better(StrEnum):
    """Which direction of the value meets the target."""

    HIGHER = "higher"
    LOWER = "lower"


class Verdict(StrEnum):
    """A figure against its target."""

    PASS = "PASS"
    SHORT = "SHORT"
    NONE = "—"  # no target stated


@dataclass(frozen=True)
class Result:
    """One headline figure of a benchmark.

    Attributes:
        name: The figure's name, unique within its benchmark (e.g. ``http_turns_per_core``).
        value: The measured value.
        target: The stated target, or None when the benchmark states none.
        unit: Unit of ``value`` and ``target`` (``"x"`` for a ratio).
        better: Whether a higher or a lower value meets the target.
        baseline: The baseline measured in the same run, when the figure has one.
    """

    name: str
    value: float
    target: float | None = None
    unit: str = ""
    better: Better = Better.HIGHER
    baseline: float | None = None

    def __post_init__(self) -> None:
        if not self.name or any(c.isspace() for c in self.name):
            raise ValueError(f"figure name must be non-empty without spaces, got {self.name!r}")
        object.__setattr__(self, "better", Better(self.better))
        for field in ("value", "target", "baseline"):
            v = getattr(self, field)
            if v is not None:
                object.__setattr__(self, field, float(v))

    @property
    def ratio(self) -> float | None:
        """value / target, or None without a (non-zero) target."""
        if self.target is None or self.target == 0:
            return None
        return self.value / self.target

    @property
    def verdict(self) -> Verdict:
        """PASS when the value meets the target in the ``better`` direction."""
        if self.target is None or math.isnan(self.value):
            return Verdict.NONE if self.target is None else Verdict.SHORT
        ok = (
            self.value >= self.target if self.better is Better.HIGHER else self.value <= self.target
        )
        return Verdict.PASS if ok else Verdict.SHORT

    def to_json(self) -> dict[str, object]:
        """The fields as JSON-ready values."""
        d = asdict(self)
        d["better"] = str(self.better)
        return d

    def to_line(self) -> str:
        """``BENCH-RESULT {json}`` on one line."""
        return PREFIX + json.dumps(self.to_json(), ensure_ascii=False, allow_nan=True)


def parse_line(line: str) -> Result | None:
    """The Result on a ``BENCH-RESULT`` line, None for any other line.

    Raises:
        ValueError: The line has the prefix but no valid result after it.
    """
    line = line.rstrip("\r\n")
    if not line.startswith(PREFIX):
        return None
    try:
        d = json.loads(line[len(PREFIX) :])
        return Result(**d)
    except (json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"malformed {PREFIX.strip()} line: {line!r} ({e})") from e


def report(
    name: str,
    value: float,
    *,
    target: float | None = None,
    unit: str = "",
    better: Better | str = Better.HIGHER,
    baseline: float | None = None,
    file: TextIO | None = None,
) -> Result:
    """Print one headline figure as a ``BENCH-RESULT`` line and return it.

    Args:
        name: The figure's name, unique within the benchmark, no spaces.
        value: The measured value.
        target: The target the benchmark's docstring or issue states; None if none.
        unit: Unit of value and target (``"x"`` for a ratio).
        better: ``"higher"`` or ``"lower"``: which direction meets the target.
        baseline: The same-run baseline, if any.
        file: Where to print (default stdout).
    """
    r = Result(name, value, target, unit, Better(better), baseline)
    print(r.to_line(), file=file or sys.stdout, flush=True)
    return r
