"""The inspector off loopback: refused without --token, and then the token opens every door."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from agentrl.cli.app import app
from agentrl.inspector import RunData, create_app
from agentrl.inspector.serve import TOKEN_ENV, TokenGate
from tests.helpers.run_dirs import write_run

TOKEN = "inspector-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def run_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("run")
    write_run(path, steps=1, per_step=2)
    return path


def test_a_reachable_host_without_a_token_is_refused(run_path, monkeypatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    for host in ("0.0.0.0", "192.0.2.10"):
        out = CliRunner().invoke(app, ["view", str(run_path), "--web", "--host", host])
        text = " ".join(out.output.split())
        assert out.exit_code == 2, text
        assert f"--host {host}" in text and "--token" in text and TOKEN_ENV in text
        assert "Traceback" not in text


def test_every_request_needs_the_token(run_path) -> None:
    web = create_app(RunData(str(run_path)))
    web.add_middleware(TokenGate, token=TOKEN)
    http = TestClient(web)
    forged = TestClient(web, cookies={"agentrl_inspector_token": "nope"})
    for path in ("/", "/api/run", "/api/steps", "/api/episode/1-0"):
        assert http.get(path).status_code == 401, path
        assert http.get(path, params={"token": TOKEN[:-1] + "x"}).status_code == 401
        assert http.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert forged.get(path).status_code == 401
    assert http.get("/api/steps", headers={"Authorization": f"Bearer {TOKEN}"}).json()["total"] == 1
    first = http.get("/", params={"token": TOKEN})  # a browser's first visit
    assert first.status_code == 200
    assert (
        "HttpOnly" in first.headers["set-cookie"]
        and "SameSite=Strict" in first.headers["set-cookie"]
    )
    assert http.get("/api/steps").json()["total"] == 1  # the cookie carries it from now on


def test_the_cli_serves_on_all_interfaces_behind_the_token(run_path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", TOKEN_ENV: TOKEN}
    cmd = [sys.executable, "-m", "agentrl.cli", "view", str(run_path), "--web", "--port", "0",
           "--host", "0.0.0.0"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert "inspector for" in line, line + (proc.stderr.read() if proc.stderr else "")
        port = int(line.split(" at ")[1].strip().rstrip("/").rsplit(":", 1)[1])
        url = f"http://127.0.0.1:{port}/api/steps"
        deadline = time.monotonic() + 60
        while True:
            try:
                refused = httpx.get(url, timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not answer"
                time.sleep(0.2)
        assert refused.status_code == 401
        assert httpx.get(url, params={"token": TOKEN}, timeout=5).json()["total"] == 1
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert TOKEN not in out + err
