"""The scale benchmarks' --quick modes: 200 concurrent ``openai``-client sessions through the
gateway lose none, and 2,000 episodes through one AgentLoop leave the driver's memory flat.

Each runs as ``make bench`` runs it (a subprocess, ``python -m benchmarks.X --quick``),
with its own scripted server and, for the gateway, the gateway in a process of its own;
the test reads the figures from the BENCH-RESULT lines it prints.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.report import Result, parse_line
from benchmarks.scale_episodes import SLOPE_LIMIT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def _figures(module: str) -> tuple[int, dict[str, Result], str]:
    proc = subprocess.run(
        [sys.executable, "-m", module, "--quick", "--timeout-s", "200"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    found = [r for r in map(parse_line, proc.stdout.splitlines()) if r is not None]
    return proc.returncode, {r.name: r for r in found}, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_200_concurrent_gateway_sessions_lose_nothing() -> None:
    _, figures, out = _figures("benchmarks.scale_gateway")
    assert figures["sessions"].value == 200, out
    assert figures["sessions_lost"].value == 0, out
    assert figures["errors"].value == 0, out
    assert figures["peak_requests_in_flight"].value > 1, out  # the sessions overlapped
    assert figures["gateway_cpu_per_request"].value > 0
    # A closed session's record kept by mistake is ~30-50 KiB: a second wave would regrow by
    # that much. (The benchmark's own limit is tighter; at 200 sessions one allocator arena
    # is ~5 KiB a session, so the test leaves room for that noise.)
    assert figures["rss_regrowth_per_session"].value <= 20, out


def test_2000_episodes_leave_the_driver_memory_flat() -> None:
    rc, figures, out = _figures("benchmarks.scale_episodes")
    assert rc == 0, out
    assert figures["episodes"].value == 2000
    assert figures["unexpected_episodes"].value == 0, out
    assert figures["rss_slope"].value <= SLOPE_LIMIT, out
