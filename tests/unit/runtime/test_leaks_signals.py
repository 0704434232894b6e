"""SIGTERM of ``agentrl`` unwinds like Ctrl-C: ``finally`` and ``async with`` exits run
(servers, sandboxes and weight files are released), and the exit status is 143."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

APP = textwrap.dedent(
    """
    import asyncio, sys, time
    from agentrl.cli.errors import run_cli
    from agentrl.runtime.lifecycle import AsyncClosing

    marker = sys.argv[1]

    class Resource(AsyncClosing):
        async def close(self):
            await asyncio.sleep(0.1)  # cleanup that awaits still completes
            open(marker, "w").write("closed")

    async def run_async():
        async with Resource():
            print("ready", flush=True)
            await asyncio.sleep(60)

    def app(args, prog_name):
        if sys.argv[2] == "async":
            asyncio.run(run_async())
            return
        try:
            print("ready", flush=True)
            time.sleep(60)
        finally:
            open(marker, "w").write("closed")

    run_cli(app, [])
    """
)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_sigterm_runs_cleanup_and_exits_143(tmp_path: Path, kind: str) -> None:
    marker = tmp_path / "marker"
    p = subprocess.Popen(
        [sys.executable, "-c", APP, str(marker), kind], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 143
    assert marker.read_text() == "closed"
