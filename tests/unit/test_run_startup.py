"""Start-up checks of `agentrl train`: unreachable servers and sandboxes that cannot start."""

from __future__ import annotations

import socket

import pytest

from agentrl.envs.retool import RetoolEnv
from agentrl.orchestration.startup import ComponentError, check_servers, preflight_env
from agentrl.sandbox.base import SandboxError
from agentrl.testing.scripted_server import RandomPolicy, ScriptedServer


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_server_is_named():
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(ComponentError, match=rf"cannot reach the inference servers.*{url}"):
        await check_servers([url], timeout_s=2)


async def test_reachable_server_passes():
    with ScriptedServer(RandomPolicy(10, eos_id=9)) as srv:
        await check_servers([srv.url])


class BrokenSandbox:
    async def start(self):
        raise SandboxError("namespaces are not permitted here")

    async def close(self):
        pass


async def test_sandbox_that_cannot_start_fails_the_run_at_start_up():
    with pytest.raises(ComponentError, match=r"RetoolEnv cannot start: .*namespaces"):
        await preflight_env(RetoolEnv, {"sandbox_factory": BrokenSandbox})


async def test_working_sandbox_passes_preflight():
    await preflight_env(RetoolEnv, {})
