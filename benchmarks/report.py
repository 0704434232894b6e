"""One machine-readable line per headline figure, and the table of recorded results.

A benchmark calls :func:`report` beside its human output; it prints
``BENCH-RESULT {json}`` on stdout, which ``benchmarks/run_all.py`` collects from
each benchmark's subprocess into one table (value, target, value/target, PASS or
SHORT) and a JSON file.

``benchmarks/results.json`` keeps the last recorded figures of each benchmark (the
docs link to it instead of quoting numbers). ``python -m benchmarks.report`` prints
it as Markdown tables; ``--merge bench-results.json`` first records the figures of a
full ``make bench`` run (``run_all``'s JSON) into it.

Run: ``python -m benchmarks.report [--merge RUN_JSON] [--results PATH]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO

PREFIX = "BENCH-RESULT "
RESULTS = Path(__file__).resolve().parent / "results.json"


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


# --- benchmarks/results.json: the recorded figures, as Markdown -------------------------

_RESULT_FIELDS = {f.name for f in fields(Result)}
_NOT_FIGURES = {"date", "commit", "machine", "note", "results", "table"}


def figures(entry: dict[str, Any]) -> list[tuple[Result, list[float] | None]]:
    """The figures of one results.json entry, each with its ``range`` over runs, if any.

    An entry holds a ``results`` list (``Result`` fields, plus an optional ``range``
    [low, high]); an entry without one (``make_train``'s) gives its top-level numbers,
    in seconds where the key ends in ``_s``.
    """
    if "results" in entry:
        out = []
        for d in entry["results"]:
            r = Result(**{k: v for k, v in d.items() if k in _RESULT_FIELDS} | nan_if_null(d))
            out.append((r, d.get("range")))
        return out
    return [
        (Result(k, v, unit="s" if k.endswith("_s") else ""), None)
        for k, v in entry.items()
        if k not in _NOT_FIGURES and isinstance(v, int | float) and not isinstance(v, bool)
    ]


def nan_if_null(d: dict[str, Any]) -> dict[str, float]:
    """``value`` as NaN where the JSON holds null (``run_all`` writes NaN so)."""
    return {"value": math.nan} if d.get("value") is None else {}


def _fmt(v: float) -> str:
    a = abs(v)
    if a != 0 and (a >= 1e5 or a < 1e-3):
        return f"{v:.3g}"
    return f"{v:,.0f}" if a >= 100 else f"{v:.3g}"


def _cell(s: object) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def markdown(data: dict[str, dict[str, Any]]) -> str:
    """results.json as Markdown: one table of every figure, then each entry's own table
    (``table``: columns and rows) and its setup notes."""
    head = "| benchmark | figure | value | range | target | value/target | result | date |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for bench, entry in data.items():
        date = str(entry.get("date") or "—")[:10]
        for r, rng in figures(entry):
            unit = f" {r.unit}" if r.unit else ""
            target = "—"
            if r.target is not None:
                target = f"{'≥' if r.better == Better.HIGHER else '≤'} {_fmt(r.target)}{unit}"
            span = "—" if not rng else f"{_fmt(rng[0])}–{_fmt(rng[1])}"
            ratio = "—" if r.ratio is None else f"{r.ratio:.2f}"
            cells = [bench, r.name, _fmt(r.value) + unit, span, target, ratio, r.verdict, date]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    for bench, entry in data.items():
        table = entry.get("table")
        if table:
            lines += ["", f"{bench}:", ""]
            lines.append("| " + " | ".join(_cell(c) for c in table["columns"]) + " |")
            lines.append("|" + "---|" * len(table["columns"]))
            lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table["rows"]]
    notes = [(b, e) for b, e in data.items() if e.get("note")]
    if notes:
        lines += ["", "Setups:", ""]
        for bench, entry in notes:
            cpus = (entry.get("machine") or {}).get("cpus")
            where = f" ({cpus} CPUs)" if cpus else ""
            lines.append(f"- **{bench}**{where}: {entry['note']}")
    return "\n".join(lines)


def merge(run: dict[str, Any], data: dict[str, dict[str, Any]]) -> list[str]:
    """Record the figures of a ``run_all`` JSON (not ``--quick``) into ``data``.

    Each benchmark that ran without failing replaces its entry (its ``note`` and
    ``table`` are kept); failed ones are left as they were. Returns the names recorded.

    Raises:
        ValueError: The run used ``--quick`` sizes, whose figures are not for tracking.
    """
    if run.get("quick"):
        raise ValueError("a --quick run's figures are not recorded; run make bench in full")
    done = []
    for b in run.get("benchmarks", []):
        if b.get("status") != "ok" or not b.get("results"):
            continue
        old = data.get(b["benchmark"], {})
        entry = {k: run.get(k) for k in ("date", "commit", "machine")}
        entry |= {k: old[k] for k in ("note", "table") if k in old}
        entry["results"] = [
            {k: v for k, v in r.items() if k in _RESULT_FIELDS} for r in b["results"]
        ]
        data[b["benchmark"]] = entry
        done.append(b["benchmark"])
    return done


def record(name: str, entry: dict[str, Any], results: Path = RESULTS) -> None:
    """Stores ``entry`` (a benchmark's own figures) in ``results`` under ``name``, with the
    date, the commit and the machine."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=results.parent,
        capture_output=True,
        text=True,
    ).stdout.strip()
    data = json.loads(results.read_text()) if results.is_file() else {}
    data[name] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        **entry,
    }
    results.write_text(json.dumps(data, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="The recorded benchmark figures as Markdown.")
    p.add_argument("--results", type=Path, default=RESULTS, help="results.json to read.")
    p.add_argument("--merge", type=Path, help="record a run_all JSON (bench-results.json) first")
    a = p.parse_args(argv)
    data = json.loads(a.results.read_text()) if a.results.is_file() else {}
    if a.merge:
        try:
            done = merge(json.loads(a.merge.read_text()), data)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        a.results.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        print(f"recorded {', '.join(done) or 'nothing'} in {a.results}\n")
        from benchmarks import reliability  # its table in docs/ follows results.json

        if a.results == RESULTS and set(done) & set(reliability.BENCHMARKS):
            reliability.main([])
    print(markdown(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
