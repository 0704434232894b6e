"""The sandbox ramp's --quick mode: 2 then 4 real Docker sandboxes running SWE-style commands
without a failure, requests past the pool's capacity queued and then served, one past
``max_waiting`` refused, and no container or volume of the run left behind.

It runs as ``make bench`` runs it (a subprocess, ``python -m benchmarks.sandbox_ramp
--quick``); the test reads the figures from the BENCH-RESULT lines it prints.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.report import parse_line
from tests.integration import docker_fixtures

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
docker_image = docker_fixtures.docker_image  # the session fixture: engine up, image built

ROOT = Path(__file__).resolve().parents[2]


def test_sandbox_ramp_quick_queues_past_capacity_and_leaves_nothing(docker_image: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.sandbox_ramp", "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    found = [r for r in map(parse_line, proc.stdout.splitlines()) if r is not None]
    figures = {r.name: r.value for r in found}
    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, out
    assert figures["levels_held"] == 4, out
    assert figures["failures"] == 0, out
    assert figures["execs_per_s@4"] > 0, out  # the sandboxes did run commands
    assert figures["queued_requests"] > 0, out  # past capacity they waited ...
    assert figures["queue_failures"] == 0, out  # ... and then ran
    assert figures["queue_bound_refused"] == 1, out  # past max_waiting: the clear error
    assert figures["containers_left"] == 0, out
    assert figures["volumes_left"] == 0, out
