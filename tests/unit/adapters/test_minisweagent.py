"""AgentrlSandboxEnvironment: mini-swe-agent's own DefaultAgent runs its commands in an agentrl
sandbox (a double that runs them as host processes in a temporary directory)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from agentrl.adapters.minisweagent import (
    INSTALL_HINT,
    AgentrlSandboxEnvironment,
    MiniSweAgentMissingError,
    SandboxEnvironmentError,
    minisweagent_module,
    require_minisweagent,
)
from agentrl.errors import UserError
from agentrl.sandbox.base import ExecResult
from tests.helpers.host_sandbox import HostSandbox

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import get_config_from_spec
from minisweagent.exceptions import Submitted
from minisweagent.models.test_models import DeterministicModel, make_output


async def in_thread(fn: Any) -> Any:
    result: dict[str, Any] = {}
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def run() -> None:
        try:
            result["value"] = fn()
        except BaseException as e:
            result["error"] = e
        loop.call_soon_threadsafe(done.set)

    threading.Thread(target=run, daemon=True).start()
    await asyncio.wait_for(done.wait(), 30)
    if "error" in result:
        raise result["error"]
    return result["value"]


def env_in(tmp_path: Path, sandbox: HostSandbox, **kw: Any) -> AgentrlSandboxEnvironment:
    return AgentrlSandboxEnvironment(
        sandbox, loop=asyncio.get_running_loop(), cwd=str(tmp_path), **kw
    )


async def test_default_agent_runs_its_commands_in_the_sandbox_and_submits(tmp_path):
    sandbox = HostSandbox()
    env = env_in(tmp_path, sandbox, env={"PAGER": "cat"}, timeout=7)
    outputs = [
        make_output("write", [{"command": "printf 'fixed\\n' > fix.txt && echo $PAGER"}]),
        make_output("look", [{"command": "cat fix.txt; exit 3"}]),
        make_output("done", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}]),
    ]
    # mini-swe-agent's default config: its prompts render with the env's template variables.
    agent_config = get_config_from_spec("mini.yaml")["agent"]
    agent = DefaultAgent(
        DeterministicModel(outputs=outputs, cost_per_call=0.0), env, **agent_config
    )
    exit_info = await in_thread(lambda: agent.run("Fix the bug"))

    assert exit_info["exit_status"] == "Submitted"
    assert (tmp_path / "fix.txt").read_text() == "fixed\n"  # the command ran in cwd
    assert [(c.command, c.returncode) for c in env.commands] == [
        ("printf 'fixed\\n' > fix.txt && echo $PAGER", 0),
        ("cat fix.txt; exit 3", 3),
        ("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", 0),
    ]
    assert all(c["timeout_s"] == 7 and c["env"] == {"PAGER": "cat"} for c in sandbox.calls)
    observations = [m["content"] for m in agent.messages if m["role"] == "user"][1:]
    assert "cat" in observations[0] and "<returncode>0</returncode>" in observations[0]
    assert "fixed" in observations[1] and "<returncode>3</returncode>" in observations[1]
    system = agent.messages[1]["content"]
    assert "Please solve this issue: Fix the bug" in system and os.uname().sysname in system


async def test_a_command_past_its_timeout_is_killed_and_reported(tmp_path):
    env = env_in(tmp_path, HostSandbox(), timeout=30, max_timeout=0.5)
    out = await in_thread(lambda: env.execute({"command": "sleep 20"}, timeout=60))
    assert out["returncode"] == -1 and "timed out after 0.5 seconds" in out["exception_info"]
    assert env.commands[0].timed_out


async def test_the_submit_line_submits_only_when_first_and_successful(tmp_path):
    env = env_in(tmp_path, HostSandbox())
    failed = await in_thread(
        lambda: env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; exit 1"})
    )
    assert failed["returncode"] == 1
    later = await in_thread(
        lambda: env.execute({"command": "echo a; echo " + "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})
    )
    assert later["returncode"] == 0
    with pytest.raises(Submitted) as info:
        await in_thread(
            lambda: env.execute(
                {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo patch"}
            )
        )
    assert info.value.messages[0]["extra"] == {"exit_status": "Submitted", "submission": "patch\n"}


async def test_sandbox_errors_are_outputs_and_a_closed_env_refuses(tmp_path):
    class Broken(HostSandbox):
        async def exec(self, cmd: Any, **kw: Any) -> ExecResult:
            from agentrl.sandbox.base import SandboxError

            raise SandboxError("container died")

    env = env_in(tmp_path, Broken())
    out = await in_thread(lambda: env.execute({"command": "true"}))
    assert out["returncode"] == -1 and "container died" in out["exception_info"]
    env.close()
    env.close()  # idempotent
    with pytest.raises(SandboxEnvironmentError, match="closed"):
        await in_thread(lambda: env.execute({"command": "true"}))


async def test_close_cancels_the_command_in_flight(tmp_path):
    env = env_in(tmp_path, HostSandbox(), timeout=20)
    pending = asyncio.ensure_future(in_thread(lambda: env.execute({"command": "sleep 20"})))
    await asyncio.sleep(0.5)
    env.close()
    with pytest.raises(SandboxEnvironmentError, match="closed"):
        await asyncio.wait_for(pending, 10)


async def test_execute_on_the_loop_thread_says_to_use_a_worker_thread(tmp_path):
    env = env_in(tmp_path, HostSandbox())
    with pytest.raises(SandboxEnvironmentError, match="worker thread"):
        env.execute({"command": "true"})


def test_template_vars_and_serialize_are_mini_swe_agents_shapes(tmp_path):
    loop = asyncio.new_event_loop()
    try:
        env = AgentrlSandboxEnvironment(
            HostSandbox(), loop=loop, cwd="/repo", environment_class="x"
        )
    finally:
        loop.close()
    tv = env.get_template_vars(extra=1)
    assert {"system", "release", "version", "machine"} <= tv.keys()
    assert tv["cwd"] == "/repo" and tv["extra"] == 1
    assert env.serialize()["info"]["config"]["environment_type"].endswith(
        "AgentrlSandboxEnvironment"
    )


def test_missing_package_is_one_message_naming_the_extra(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(MiniSweAgentMissingError) as e:
        require_minisweagent()
    assert isinstance(e.value, UserError) and str(e.value).endswith(INSTALL_HINT)
    monkeypatch.setitem(sys.modules, "minisweagent.config", None)
    with pytest.raises(MiniSweAgentMissingError, match=r"agentrl\[swe-agents\]"):
        minisweagent_module("minisweagent.config")
