"""One training step of the real CLI in a subprocess, checked and its episodes returned."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from agentrl.reporting.run_dir import RunDir, read_trajectories
from agentrl.types import Trajectory


def train_one_step(
    cli: Sequence[str],
    overrides: Mapping[str, object],
    run_dir: Path,
    *,
    episodes: int,
    weight_version: float | None = 1.0,
    timeout: float = 800,
    env: Mapping[str, str] | None = None,
) -> list[Trajectory]:
    """Runs ``agentrl train CLI… KEY=VALUE…``; asserts it exited 0, trained step 1 only
    (on ``weight_version`` when given) and saved ``episodes`` episodes; returns them."""
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", *cli,
         *(f"{k}={v}" for k, v in overrides.items())],
        capture_output=True, text=True, timeout=timeout, env=None if env is None else dict(env),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [m for m in RunDir(run_dir).metrics() if m["kind"] == "train"]
    assert [m["step"] for m in lines] == [1], lines
    if weight_version is not None:
        assert lines[0]["weight_version"] == weight_version, lines[0]
    trajs = read_trajectories(run_dir / "trajectories" / "step_000001.parquet")
    assert len(trajs) == episodes, [(t.stop_reason, t.error) for t in trajs]
    return trajs
