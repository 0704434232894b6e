"""The session-end leak check fails a test run that leaves a process or a path of ours.

Each case runs a real pytest session in a subprocess with the check of tests/conftest.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from agentrl.runtime.watchdog import LEDGER_ENV
from tests.helpers.paths import REPO
from tests.leak_check import MARK_ENV

LEAKY = textwrap.dedent(
    """
    import os, subprocess, sys
    from agentrl.runtime.watchdog import watch_path

    def test_leaks(tmp_path):
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                             start_new_session=True)
        open(os.environ["PIDFILE"], "w").write(str(p.pid))
        d = tmp_path / "agentrl-weights-leaked"
        d.mkdir()
        watch_path(d)  # registered, never closed: still there when the session ends
    """
)

CLEAN = textwrap.dedent(
    """
    import subprocess, sys
    from multiprocessing import resource_tracker, shared_memory
    from agentrl.runtime.watchdog import unwatch_path, watch_path

    def test_clean(tmp_path):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        # multiprocessing's resource tracker: a child of the session that ends with it
        mem = shared_memory.SharedMemory(create=True, size=16)
        mem.close()
        mem.unlink()
        assert resource_tracker._resource_tracker._pid is not None
        d = tmp_path / "agentrl-weights-closed"
        d.mkdir()
        watch_path(d)
        d.rmdir()
        unwatch_path(d)
    """
)


def _session(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_inner.py"
    test.write_text(code)
    env = {k: v for k, v in os.environ.items() if k not in (MARK_ENV, LEDGER_ENV)}
    env["PIDFILE"] = str(tmp_path / "pid")
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(test)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_session_that_leaves_a_process_and_a_path_fails(tmp_path: Path) -> None:
    r = _session(tmp_path, LEAKY)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "LEAK CHECK FAILED" in out and "1 passed" in out
    pid = int((tmp_path / "pid").read_text())
    assert f"process {pid}:" in out and "agentrl-weights-leaked" in out
    assert (
        not Path(f"/proc/{pid}/cmdline").exists() or not Path(f"/proc/{pid}/cmdline").read_bytes()
    ), "the leaked process was not ended after the report"


def test_a_session_that_cleans_up_passes(tmp_path: Path) -> None:
    r = _session(tmp_path, CLEAN)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "LEAK CHECK" not in r.stdout
