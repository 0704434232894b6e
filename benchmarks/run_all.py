"""Runs every benchmark in turn (``make bench``), then one table of their headline figures.

Each benchmark runs as a subprocess and streams its own output; the
``BENCH-RESULT`` lines it prints (``benchmarks/report.py``) are collected into one
table (benchmark | figure | value | target | value/target | PASS / SHORT / —) and
a JSON file with the machine, date and git commit. A benchmark that crashes shows
as FAILED and makes the exit status 1.

Run: ``python -m benchmarks.run_all [--only parsers,templates] [--quick] [--json PATH]``.
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
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from benchmarks.report import Result, parse_line

ROOT = Path(__file__).resolve().parents[1]

BENCHMARKS = [
    "benchmarks.rollout_overhead",
    "benchmarks.delta_tokenization",
    "benchmarks.parsers",
    "benchmarks.templates",
    "benchmarks.async_speedup",
    "benchmarks.async_real",
    "benchmarks.sandbox_local",
    "benchmarks.sandbox_docker",
    "benchmarks.sandbox_fork",
    "benchmarks.sandbox_fork_docker",
    "benchmarks.trainer_microbatch",
    "benchmarks.trainer_shared_prefix",
    "benchmarks.trainer_logprob_memory",
    "benchmarks.inference_overhead",
    "benchmarks.inference_routing",
    "benchmarks.inference_weight_sync",
    "benchmarks.reward_model",
    "benchmarks.gateway",
    "benchmarks.scale_gateway",
    "benchmarks.scale_episodes",
    "benchmarks.sandbox_ramp",
    "benchmarks.make_train",
    "benchmarks.vs_trl",
    "benchmarks.lora_vs_full",
    "benchmarks.swe_train",
    "benchmarks.tree_vs_flat",
    "benchmarks.soak",
    "benchmarks.ray_node_loss",
]

# Arguments of the full run (``make bench``).
FULL_ARGS: dict[str, list[str]] = {
    # Equal workloads in every mode (lr 1e-12): the speedup measures the overlap alone;
    # three interleaved rounds, ratios paired within a round (about 20 minutes).
    "benchmarks.async_real": ["--frozen", "--repeats", "3"],
    # Six levels of concurrent Docker sandboxes, 8 → 256, each held 120 s (about 20
    # minutes with the starts; the 600 s a level is `--level-s 600`, an hour).
    "benchmarks.sandbox_ramp": ["--level-s", "120"],
}

# Smaller sizes for ``--quick``: figures from these are for iteration, not tracking.
QUICK_ARGS: dict[str, list[str]] = {
    "benchmarks.rollout_overhead": ["--episodes", "200", "--turns", "4"],
    "benchmarks.delta_tokenization": ["--turns", "32", "--reps", "3"],
    "benchmarks.parsers": ["--reps", "200"],
    "benchmarks.templates": ["--turns", "32", "--reps", "1"],
    "benchmarks.async_speedup": ["--steps", "3", "--tasks", "8"],
    "benchmarks.async_real": ["--steps", "3", "--eval-tasks", "16"],
    "benchmarks.sandbox_local": ["--n", "30"],
    "benchmarks.sandbox_docker": ["--n", "10"],
    "benchmarks.sandbox_fork": ["--n", "5"],
    "benchmarks.sandbox_fork_docker": ["--n", "5"],
    "benchmarks.trainer_microbatch": ["--rounds", "1"],
    "benchmarks.trainer_shared_prefix": ["--rounds", "1"],
    "benchmarks.trainer_logprob_memory": ["--tokens", "2048", "--vocab", "8192"],
    "benchmarks.inference_overhead": ["--episodes", "4", "--turns", "2", "--rounds", "1"],
    "benchmarks.inference_routing": ["--episodes", "4", "--turns", "2"],
    "benchmarks.inference_weight_sync": ["--syncs", "1"],
    "benchmarks.reward_model": ["--n", "16", "--length", "64", "--batch", "8", "--rounds", "1"],
    "benchmarks.gateway": ["--episodes", "32", "--concurrency", "32", "--turns", "2"],
    "benchmarks.scale_gateway": ["--quick"],
    "benchmarks.scale_episodes": ["--quick"],
    "benchmarks.sandbox_ramp": ["--quick"],
    "benchmarks.make_train": ["--keep-cache"],  # the model from the user's cache
    "benchmarks.vs_trl": ["--quick"],
    "benchmarks.lora_vs_full": ["--quick"],
    "benchmarks.swe_train": ["--quick"],
    "benchmarks.tree_vs_flat": ["--quick"],
    "benchmarks.soak": ["--quick"],
    "benchmarks.ray_node_loss": ["--quick"],
}


@dataclass
class Outcome:
    """One benchmark's run: its exit status and the figures it reported."""

    module: str
    returncode: int
    seconds: float
    results: list[Result] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """Crashed, or printed a malformed result line."""
        return self.returncode != 0 or bool(self.errors)

    @property
    def short_name(self) -> str:
        """The module name without the ``benchmarks.`` package."""
        return self.module.removeprefix("benchmarks.")


def resolve(names: str) -> list[str]:
    """Module names for ``--only``'s comma-separated list.

    ``parsers`` → ``benchmarks.parsers``; a dotted name is taken as a module as is.

    Raises:
        SystemExit: A name is neither a known benchmark nor a dotted module name.
    """
    out = []
    for raw in names.split(","):
        name = raw.strip()
        if not name:
            continue
        if "." in name:
            out.append(name)
        elif (ROOT / "benchmarks" / f"{name}.py").is_file():
            out.append(f"benchmarks.{name}")
        else:
            known = ", ".join(m.removeprefix("benchmarks.") for m in BENCHMARKS)
            raise SystemExit(f"unknown benchmark {name!r}; known: {known}")
    return out


def run_one(module: str, args: Sequence[str] = (), out: TextIO | None = None) -> Outcome:
    """Run ``python -m module args`` streaming its output, collecting its BENCH-RESULT lines."""
    stream = out or sys.stdout
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    outcome = Outcome(module, 0, 0.0)
    with subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", file=stream, flush=True)
            try:
                r = parse_line(line)
            except ValueError as e:
                outcome.errors.append(str(e))
                continue
            if r is not None:
                outcome.results.append(r)
        outcome.returncode = proc.wait()
    outcome.seconds = time.perf_counter() - t0
    return outcome


def _fmt(v: float | None) -> str:
    if v is None:
        return "—"
    a = abs(v)
    if a != 0 and (a >= 1e5 or a < 1e-3):
        return f"{v:.3g}"
    return f"{v:,.0f}" if a >= 100 else f"{v:.3g}"


def rows(outcomes: Sequence[Outcome]) -> list[list[str]]:
    """Table rows: benchmark, figure, value, target, value/target, verdict."""
    out = []
    for o in outcomes:
        for r in o.results:
            unit = f" {r.unit}" if r.unit else ""
            target = "—" if r.target is None else f"{'≥' if r.better == 'higher' else '≤'} "
            if r.target is not None:
                target += _fmt(r.target) + unit
            ratio = "—" if r.ratio is None else f"{r.ratio:.2f}"
            out.append([o.short_name, r.name, _fmt(r.value) + unit, target, ratio, r.verdict])
        if o.failed:
            why = f"exit {o.returncode}" if o.returncode else "; ".join(o.errors)[:60]
            out.append([o.short_name, f"({why})", "—", "—", "—", "FAILED"])
        elif not o.results:
            out.append([o.short_name, "(no figures reported)", "—", "—", "—", "—"])
    return out


HEADER = ["benchmark", "figure", "value", "target", "value/target", "result"]


def table(outcomes: Sequence[Outcome]) -> str:
    """The summary as a plain-text table."""
    body = rows(outcomes)
    widths = [max(len(r[i]) for r in [HEADER, *body]) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [HEADER, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _git_commit() -> str | None:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if dirty else "")) or None


def _finite(d: dict[str, object]) -> dict[str, object]:
    """NaN and infinities as null, so the file is strict JSON."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in d.items()}


def to_json(outcomes: Sequence[Outcome], *, quick: bool) -> dict[str, object]:
    """The run as JSON: machine, date, commit and every benchmark's figures."""
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": _git_commit(),
        "quick": quick,
        "machine": {
            "hostname": platform.node(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "benchmarks": [
            {
                "benchmark": o.short_name,
                "module": o.module,
                "status": "FAILED" if o.failed else "ok",
                "returncode": o.returncode,
                "seconds": round(o.seconds, 2),
                "errors": o.errors,
                "results": [
                    _finite({**r.to_json(), "ratio": r.ratio, "verdict": str(r.verdict)})
                    for r in o.results
                ],
            }
            for o in outcomes
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--only", default=None, help="Comma-separated benchmarks, e.g. parsers,templates."
    )
    p.add_argument("--quick", action="store_true", help="Smaller sizes, for iteration.")
    p.add_argument(
        "--json", type=Path, default=ROOT / "bench-results.json", help="Where to write the JSON."
    )
    a = p.parse_args(argv)
    modules = resolve(a.only) if a.only else BENCHMARKS
    outcomes = []
    for name in modules:
        print(f"\n=== {name}", flush=True)
        args = QUICK_ARGS.get(name, []) if a.quick else FULL_ARGS.get(name, [])
        outcomes.append(run_one(name, args))
    print(f"\n=== summary{' (--quick sizes)' if a.quick else ''}")
    print(table(outcomes))
    a.json.parent.mkdir(parents=True, exist_ok=True)
    data = to_json(outcomes, quick=a.quick)
    a.json.write_text(json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False))
    print(f"\nwrote {a.json}")
    failed = [o.short_name for o in outcomes if o.failed]
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
