"""Console progress lines, offline wandb files and the learning-curve image."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from agentrl.reporting.progress import ProgressLog, plot_curve


def test_step_line_shows_health_metrics_and_eta(tmp_path: Path):
    out = io.StringIO()
    log = ProgressLog(10, tmp_path, wandb_mode="disabled", console=Console(file=out, width=200))
    log.step(1, {"reward/mean": 0.5, "actor/entropy": 1.25, "staleness/max": 1.0})
    line = out.getvalue()
    assert line.startswith("step 1/10 | reward 0.500 | entropy 1.250 | stale 1 | eta")


def test_wandb_offline_writes_into_the_run_directory(tmp_path: Path):
    log = ProgressLog(2, tmp_path, wandb_mode="offline", config={"steps": 2},
                      console=Console(file=io.StringIO()))  # fmt: skip
    log.step(1, {"reward/mean": 0.25})
    log.close()
    log.close()  # idempotent
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))


def test_curve_png(tmp_path: Path):
    lines = [
        {"step": 0, "kind": "eval", "success": 0.2},
        {"step": 1, "kind": "train", "reward/mean": 0.3},
        {"step": 2, "kind": "train", "reward/mean": 0.6},
        {"step": 2, "kind": "eval", "success": 0.7},
    ]
    path = plot_curve(iter(lines), tmp_path / "curve.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2000
