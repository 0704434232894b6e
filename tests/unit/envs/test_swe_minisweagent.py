"""MiniSweAgent's wiring, without Docker: mini-swe-agent's own DefaultAgent and LitellmModel
(mini.yaml) talk to a real gateway over HTTP (a scripted policy that makes bash tool calls),
its tool calls run through AgentrlSandboxEnvironment, cost tracking raises nothing, and a
gateway error is not retried."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from agentrl.adapters.minisweagent import AgentrlSandboxEnvironment
from agentrl.envs.swe.minisweagent import MODEL_NAME, MiniSweAgent, solve
from agentrl.gateway import AgentRunner, Gateway
from agentrl.reporting.episode import report_episode
from agentrl.testing.scripted_server import TextPolicy
from agentrl.types import StopReason
from tests.helpers.gateway import Recording, limits
from tests.helpers.host_sandbox import HostSandbox

COMMANDS = ["printf 'x = 1\\n' > fix.py", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]


def bash_call(command: str) -> str:
    body = json.dumps({"name": "bash", "arguments": {"command": command}})
    return f"Running it.\n<tool_call>{body}</tool_call>"


def policy(prompt: str) -> str:
    n = prompt.count("<tool_response>")
    return bash_call(COMMANDS[min(n, len(COMMANDS) - 1)])


async def run_agent(tokenizer: Any, tmp_path: Path, reply: Any) -> tuple[Any, dict[str, Any]]:
    mini = MiniSweAgent()
    seen: dict[str, Any] = {}

    async def episode(task: dict[str, Any], client: Any) -> float:
        config = mini.config()
        env = AgentrlSandboxEnvironment(
            HostSandbox(), loop=asyncio.get_running_loop(), cwd=str(tmp_path)
        )
        base_url = str(client.base_url)
        seen["env"] = env

        def run() -> dict[str, Any]:
            agent = mini.build(config, env, base_url, 30.0)
            seen["agent"] = agent
            return agent.run("Fix the bug")

        t0 = time.perf_counter()
        try:
            seen["exit"] = await asyncio.to_thread(run)
        finally:
            seen["time_s"] = time.perf_counter() - t0
            env.close()
        report_episode({"commands": len(env.commands)})
        return 1.0

    llm = Recording(TextPolicy(tokenizer, reply))
    gw_limits = limits(max_turns=6, max_total_tokens=8192, max_tokens_per_turn=256)
    async with Gateway(llm, tokenizer, gw_limits) as gw:
        traj = await AgentRunner(gw, episode).run_episode({"id": "t"}, episode_id="e")
    return traj, seen


async def test_mini_swe_agents_model_and_agent_run_tool_calls_through_the_gateway(
    tokenizer, tmp_path
):
    traj, seen = await run_agent(tokenizer, tmp_path, policy)
    assert traj.error is None and traj.stop_reason == StopReason.DONE
    assert seen["exit"]["exit_status"] == "Submitted"
    assert (tmp_path / "fix.py").read_text() == "x = 1\n"
    assert [c.command for c in seen["env"].commands] == COMMANDS
    agent = seen["agent"]
    assert agent.model.config.model_name == MODEL_NAME and agent.cost == 0.0
    assert traj.metrics["gateway/api_chat"] == 2 and traj.metrics["commands"] == 2
    # mini-swe-agent sends its history back as the gateway returned it: one exact-token record.
    assert traj.metrics["gateway/segments"] == 1 and "gateway/rewrites" not in traj.metrics
    assert traj.num_model_tokens > 0
    prompt = tokenizer.decode(traj.token_ids[: traj.prompt_length])
    assert "Please solve this issue: Fix the bug" in prompt and '"bash"' in prompt


async def test_a_gateway_error_ends_the_agent_at_once_without_retries(tokenizer, tmp_path):
    traj, seen = await run_agent(tokenizer, tmp_path, lambda p: 1 / 0)
    # mini-swe-agent's default retries wait 4-60 s ten times; here the first error ends it.
    assert traj.stop_reason != StopReason.DONE and seen["time_s"] < 20
    assert "agent" in seen and seen["agent"].n_calls == 1


def test_the_shipped_solve_is_a_mini_swe_agent_on_its_default_config():
    assert isinstance(solve, MiniSweAgent) and solve.config_spec == "mini.yaml"
    config = solve.config()
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in config["agent"]["instance_template"]
