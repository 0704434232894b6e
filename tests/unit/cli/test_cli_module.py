"""``python -m agentrl`` is the ``agentrl`` command (benchmarks and the GPU tests start runs
with ``sys.executable -m agentrl``)."""

from __future__ import annotations

import subprocess
import sys


def test_python_m_agentrl_runs_the_cli() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "agentrl", "train", "--help"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "--config" in out.stdout
