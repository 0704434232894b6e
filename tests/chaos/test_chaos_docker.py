"""Chaos: the Docker daemon restarted during a SWE episode.

A real SWE episode (real containers, the AgentLoop, a scripted policy in place of the
model) runs a long ``bash`` call; meanwhile dockerd is stopped and started again with
the command line it ran with (scripts/setup-docker.sh's). The episode must end with a
reason (never hang, never crash the loop), its containers must be gone, and once the
daemon answers again a new episode must run to its grade.

dockerd is shared by everything on this machine: this case runs under the heavy-job
lock (``make test`` runs the suite serially), and makes sure the daemon comes back.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.harness import REPO, ChaosRecord
from tests.integration.docker_fixtures import containers

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(600)]

TASK_ID = "swe-001-pager-off-by-one"


def _engine_up() -> bool:
    r = subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False)
    return r.returncode == 0


def _dockerd_pid() -> int:
    pids = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True).stdout.split()
    assert pids, "no dockerd runs (scripts/setup-docker.sh starts one)"
    return int(pids[0])


def _setup_docker() -> None:
    """scripts/setup-docker.sh, detached from this session: the daemon it starts is the
    machine's, not a leftover of the tests (no session marks in its environment)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_")}
    r = subprocess.run(
        ["setsid", "bash", str(REPO / "scripts/setup-docker.sh")],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert r.returncode == 0 and _engine_up(), f"dockerd did not come back:\n{r.stderr[-2000:]}"


def _restart_dockerd() -> float:
    """Stops dockerd (SIGTERM, as a service restart does) and starts it again; seconds."""
    pid = _dockerd_pid()
    t0 = time.monotonic()
    os.kill(pid, 15)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    _setup_docker()
    return time.monotonic() - t0


def _ensure_engine() -> None:
    if not _engine_up():
        _setup_docker()


def _our_containers(pid: int) -> list[str]:
    return containers({"agentrl.pid": str(pid)}, check=False)


def _policy(calls: list[tuple[str, dict[str, Any]]]) -> Any:
    def reply(prompt: str) -> str:
        n = prompt.count("<tool_response>")
        if n >= len(calls):
            return "I am done."
        name, args = calls[n]
        return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"

    return reply


async def _episode(tokenizer: Any, image: str, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    from agentrl.envs.swe import Grader, SweEnv  # type: ignore[import-not-found]
    from agentrl.rollout import AgentLoop, LoopConfig
    from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy
    from tests.integration.docker_fixtures import LIMITS

    env = SweEnv(image=image, limits=LIMITS, grader=Grader(image=image, limits=LIMITS))
    llm = ScriptedLLM(TextPolicy(tokenizer, _policy(calls)))
    cfg = LoopConfig(max_turns=6, max_total_tokens=32768, max_tokens_per_turn=2048,
                     episode_timeout_s=240)  # fmt: skip
    try:
        return await AgentLoop(llm, tokenizer, cfg).run(env, {"id": TASK_ID}, task_id=TASK_ID)
    finally:
        await env.close()


def test_docker_daemon_restarted_during_swe_episode(tokenizer):
    from agentrl.sandbox.images import ensure_image

    rec = ChaosRecord("dockerd-restart-mid-swe-episode", "swe episode")
    _ensure_engine()
    image = ensure_image("python")
    try:
        slow = [("bash", {"command": "echo started; sleep 25; echo finished"}), ("submit", {})]

        async def run() -> tuple[Any, float, float]:
            episode = asyncio.create_task(_episode(tokenizer, image, slow))
            await asyncio.sleep(0)
            deadline = time.monotonic() + 120
            while not _our_containers(os.getpid()):  # the agent's container is up
                assert time.monotonic() < deadline, "the episode's container never started"
                await asyncio.sleep(0.5)
            await asyncio.sleep(3.0)  # into the bash call
            restart = await asyncio.to_thread(_restart_dockerd)
            t0 = time.monotonic()
            traj = await asyncio.wait_for(episode, 300)
            return traj, restart, time.monotonic() - t0

        traj, restart_s, end_s = asyncio.run(run())
        tools = [m.content for m in traj.messages if m.role == "tool"]
        rec.detail = (
            f"dockerd back in {restart_s:.0f}s; episode ended {end_s:.0f}s later: stop "
            f"{traj.stop_reason}, error {str(traj.error)[:120]!r}, tool said {tools[:1]!r:.160}"
        )
        # Ended with a reason: an env error the run counts, or a graded end the model saw.
        assert traj.stop_reason is not None
        assert traj.error or any("error" in t.lower() or "killed" in t.lower() for t in tools), (
            rec.detail
        )
        left = _our_containers(os.getpid())
        rec.leaks = [f"container {c}" for c in left]

        t1 = time.monotonic()
        quick = [("bash", {"command": "ls"}), ("submit", {})]
        after = asyncio.run(_episode(tokenizer, image, quick))
        rec.recovery_s = round(restart_s + time.monotonic() - t1, 1)
        assert after.error is None and after.info.get("swe_ended_by") == "submit", after.error
        rec.outcome = "episode ended with a reason; next episode ran"
        rec.episodes_lost, rec.duplicated, rec.steps_lost = 1, 0, 0
        assert not left, f"containers of the episode left after the restart: {left}"
    finally:
        _ensure_engine()
        for c in _our_containers(os.getpid()):
            subprocess.run(["docker", "rm", "-f", c], capture_output=True, timeout=60, check=False)
        if rec.outcome == "unknown":
            rec.outcome = "failed"
        rec.write()
