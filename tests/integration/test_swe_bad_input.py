"""SWE env bad input against real Docker (issue #41): invalid tasks refused at load, no
engine at start, the agent's container killed mid-episode, the engine lost mid-episode.

The engine is never stopped: a dead ``DOCKER_HOST`` socket stands for a missing engine, and
a unix-socket proxy to it (:class:`EngineProxy`), cut and restored, for one that stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from agentrl.envs.swe import Grader, SweEnv, builtin_tasks
from agentrl.orchestration.driver import select_groups
from agentrl.rollout import AgentLoop, LoopConfig
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy
from agentrl.types import StopReason, Trajectory
from tests.integration import docker_fixtures
from tests.integration.docker_fixtures import LIMITS, containers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
docker_image = docker_fixtures.docker_image  # the session fixture, under its own name

TASK_ID = "swe-001-pager-off-by-one"
DEAD = ['inference.urls=["http://127.0.0.1:9"]', "wandb=disabled", "steps=1"]


def _cli(args: list[str], tmp: Path, **env: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", "--env", "swe", *args, *DEAD,
         f"output_dir={tmp / 'runs'}"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "2000", "AGENTRL_CACHE_DIR": str(tmp / "cache"), **env},
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def _task_file(tmp: Path) -> Path:
    task = next(t for t in builtin_tasks() if t.id == TASK_ID)
    good = task.to_row()
    wrong = task.gold_patch.replace("(page - 1) * per_page", "page * per_page + 0")
    hidden = next(iter(task.hidden_tests))
    rows = [
        good,
        {**good, "id": "bad-gold", "gold_patch": wrong},
        {**good, "id": "bad-tests", "hidden_tests": {hidden: "def test_x():\n    assert 1\n"}},
    ]
    path = tmp / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_run_refuses_invalid_tasks_at_load_naming_each(docker_image: str, tmp_path) -> None:
    rc, out = _cli([f"tasks={_task_file(tmp_path)}", "model.path=/nowhere"], tmp_path)
    assert rc == 2, out
    assert "Traceback" not in out and "run directory" not in out  # before anything started
    assert f"error: tasks={tmp_path / 'tasks.jsonl'}: 2 of 3 SWE tasks failed validation" in out, (
        out
    )
    assert "  bad-gold: the gold patch does not pass the hidden tests" in out
    assert "  bad-tests: the empty patch passes the hidden tests" in out
    assert f"  {TASK_ID}:" not in out


def test_no_engine_at_start_is_one_message(untrained_model_dir, tmp_path) -> None:
    no_engine = {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    for args in (
        [f"model.path={untrained_model_dir}"],  # the built-in tasks: the env's preflight
        [f"tasks={_task_file(tmp_path)}", "model.path=/nowhere"],  # validation at load
    ):
        rc, out = _cli(args, tmp_path, **no_engine)
        assert rc == 2, out
        errors = [x for x in out.splitlines() if x.startswith("error: ")]
        assert len(errors) == 1 and "no Docker engine answers" in errors[0], out
        assert "DOCKER_HOST" in errors[0] and "Traceback" not in out


# ----------------------------------------------------------------------------- mid-episode


def _containers() -> list[str]:
    return containers({"agentrl.pid": str(os.getpid())})


def _policy(command: str) -> Any:
    def reply(prompt: str) -> str:
        if prompt.count("<tool_response>"):
            return '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
        call = {"name": "bash", "arguments": {"command": command}}
        return "<tool_call>" + json.dumps(call) + "</tool_call>"

    return reply


async def _episode_while(tokenizer: Any, image: str, fault: Any) -> Trajectory:
    """An episode whose first call runs 20 s; ``fault()`` runs 2 s into it."""
    env = SweEnv(image=image, limits=LIMITS, grader=Grader(image=image, limits=LIMITS))
    llm = ScriptedLLM(TextPolicy(tokenizer, _policy("echo started; sleep 20")))
    cfg = LoopConfig(max_turns=4, max_total_tokens=32768, max_tokens_per_turn=2048)
    run = asyncio.create_task(AgentLoop(llm, tokenizer, cfg).run(env, {"id": TASK_ID}))
    for _ in range(120):
        if env.sandbox is not None and env._editor is not None:  # reset is done
            break
        await asyncio.sleep(0.25)
    await asyncio.sleep(2.0)
    await asyncio.to_thread(fault, env.sandbox.container_id if env.sandbox else "")
    return await asyncio.wait_for(run, 120)


async def test_a_killed_container_discards_the_episode_with_its_reason(
    tokenizer: Any, docker_image: str
) -> None:
    def kill(cid: str) -> None:
        subprocess.run(["docker", "kill", cid], capture_output=True, timeout=30, check=True)

    traj = await _episode_while(tokenizer, docker_image, kill)
    assert traj.stop_reason == StopReason.ENV_ERROR, (traj.stop_reason, traj.error)
    assert "SandboxLostError: the agent's container failed" in (traj.error or "")
    assert "swe_resolved" not in traj.metrics  # not graded 0
    kept, why = select_groups([[traj]], dynamic_filter=False)
    assert not kept and why["episode:env_error"] == 1
    assert _containers() == []


class EngineProxy:
    """A unix socket forwarding to the Docker engine's, which ``cut`` closes with every
    connection through it (as a stopped engine does) and ``start`` opens again."""

    def __init__(self, path: Path, target: str = "/var/run/docker.sock") -> None:
        self.path, self.target = path, target
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server: socket.socket | None = None

    def start(self) -> EngineProxy:
        self.path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.path))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()
        return self

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
                engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                engine.connect(self.target)
            except OSError:
                return
            with self._lock:
                self._socks += [client, engine]
            for a, b in ((client, engine), (engine, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self.path.unlink(missing_ok=True)
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


async def test_the_engine_lost_mid_episode_is_named_and_no_container_is_left(
    tokenizer: Any, docker_image: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentrl.sandbox.images import docker_client

    proxy = EngineProxy(tmp_path / "engine.sock").start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{proxy.path}")
    docker_client.cache_clear()  # this test's containers go through the proxy

    def cut_then_restore(_cid: str) -> None:
        proxy.cut()  # the engine "stops"; it is back 3 s later, so the container can go
        threading.Timer(3.0, proxy.start).start()

    try:
        traj = await _episode_while(tokenizer, docker_image, cut_then_restore)
    finally:
        monkeypatch.undo()
        docker_client.cache_clear()
    assert traj.stop_reason == StopReason.ENV_ERROR, (traj.stop_reason, traj.error)
    assert "SandboxLostError: the Docker engine stopped answering" in (traj.error or "")
    assert "DOCKER_HOST" in (traj.error or "")
    assert _containers() == []
    proxy.cut()
