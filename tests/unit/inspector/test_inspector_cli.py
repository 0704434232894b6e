"""`agentrl view RUN_DIR --web`: clear errors, a real server process, Ctrl-C stops it cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from typer.testing import CliRunner

from agentrl.cli.app import app
from tests.helpers.run_dirs import write_run


@pytest.fixture(scope="module")
def run_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("run")
    write_run(path, steps=2, per_step=2)
    return path


def _view(*args: str) -> tuple[int, str]:
    """Exit code and output with line wrapping undone."""
    out = CliRunner().invoke(app, ["view", *args])
    return out.exit_code, " ".join(out.output.split())


def test_help_names_the_web_options():
    out = CliRunner().invoke(app, ["view", "--help"], terminal_width=200)
    assert out.exit_code == 0
    for opt in ("--web", "--port", "--host", "--tokenizer", "Ctrl-C"):
        assert opt in out.output, opt


def test_not_a_run_dir(tmp_path):
    code, out = _view(str(tmp_path), "--web", "--port", "0")
    assert code == 2 and "is not a run directory" in out
    code, out = _view(str(tmp_path / "nope"), "--web", "--port", "0")
    assert code == 2 and "does not exist" in out and "Traceback" not in out


def test_port_in_use_is_a_clear_error(run_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = _view(str(run_path), "--web", "--port", str(port))
    assert code == 2, out
    assert f"port {port} on 127.0.0.1 is already in use: pick another with --port" in out
    assert "Traceback" not in out


def test_unknown_host_and_bad_tokenizer(run_path, tmp_path):
    code, out = _view(str(run_path), "--web", "--host", "no-such-host.invalid", "--token", "t")
    assert code == 2 and "cannot listen on 'no-such-host.invalid': unknown host" in out
    code, out = _view(str(run_path), "--web", "--port", "0", "--tokenizer", str(tmp_path))
    assert code == 2 and "no tokenizer.json there" in out


def test_serves_the_run_and_stops_on_ctrl_c(run_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "agentrl.cli", "view", str(run_path), "--web", "--port", "0",
           "--step", "2", "--episode", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert "inspector for" in line, line + (proc.stderr.read() if proc.stderr else "")
        url = line.split(" at ")[1].strip()
        assert url.endswith("/?step=2&episode=2-1"), url
        base = url.split("?")[0]
        deadline = time.monotonic() + 60
        while True:
            try:
                steps = httpx.get(base + "api/steps", timeout=5).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not answer"
                time.sleep(0.2)
        assert steps["total"] == 2
        ep = httpx.get(base + "api/episode/2-1", timeout=10).json()
        assert ep["tokens"]["text"] is not None  # the tiny tokenizer from config.yaml
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "inspector stopped" in out and "Traceback" not in err + out
    port = int(base.rsplit(":", 1)[1].strip("/"))
    with socket.socket() as s:  # the port is free again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
