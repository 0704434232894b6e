"""The fault table of the chaos suite (tests/chaos): one row per case and mode.

Each chaos case writes a JSON record (case, mode, outcome, episodes lost,
duplicated, steps lost, recovery seconds, leaks) into the results directory,
``AGENTRL_CHAOS_RESULTS`` or ``.chaos/results`` at the repository root. This prints
them as a Markdown table, the one docs/testing.md shows (results.json key `chaos`).

Run: ``pytest -m chaos`` (or ``make test``), then ``python -m benchmarks.chaos_report``
[``--results DIR``]. Exit status 1 when there is no record, or a case failed or leaked.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.report import report

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = (
    "case",
    "mode",
    "outcome",
    "episodes lost",
    "duplicated",
    "steps lost",
    "recovery s",
    "leaks",
)


def default_dir() -> Path:
    return Path(os.environ.get("AGENTRL_CHAOS_RESULTS") or ROOT / ".chaos" / "results")


def load(results: Path) -> list[dict[str, Any]]:
    """Every record under ``results``, ordered by case then mode."""
    rows = []
    for path in sorted(results.glob("*.json")):
        try:
            rows.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            rows.append({"case": path.stem, "mode": "?", "outcome": f"unreadable record: {e}"})
    return sorted(rows, key=lambda r: (str(r.get("case")), str(r.get("mode"))))


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, list):
        return "none" if not value else f"{len(value)}: " + "; ".join(map(str, value))[:120]
    return str(value).replace("|", "/")


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of ``rows``."""
    keys = ("case", "mode", "outcome", "episodes_lost", "duplicated", "steps_lost",
            "recovery_s", "leaks")  # fmt: skip
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(k)) for k in keys) + " |")
    return "\n".join(lines)


def bad(row: dict[str, Any]) -> bool:
    """A case that failed, lost or duplicated work, or left something behind."""
    outcome = str(row.get("outcome", ""))
    return (
        outcome in ("failed", "unknown")
        or outcome.startswith("unreadable")
        or bool(row.get("episodes_lost"))
        or bool(row.get("duplicated"))
        or bool(row.get("leaks"))
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=None, help="Directory of case records.")
    p.add_argument("--details", action="store_true", help="Also print each case's detail line.")
    args = p.parse_args(argv)
    results = args.results or default_dir()
    rows = load(results) if results.is_dir() else []
    if not rows:
        print(f"no chaos records in {results}: run `pytest -m chaos` first")
        return 1
    print(table(rows))
    newest = max(float(r.get("time", 0.0)) for r in rows)
    when = time.strftime("%F %T", time.gmtime(newest))
    print(f"\n{len(rows)} records from {results}, newest {when} UTC")
    if args.details:
        for r in rows:
            print(f"- {r.get('case')} [{r.get('mode')}]: {r.get('detail', '')}")
    report("cases", len(rows), unit="records")
    report("cases_failed_lost_or_leaked", sum(map(bad, rows)), target=0, better="lower")
    return 1 if any(bad(r) for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
