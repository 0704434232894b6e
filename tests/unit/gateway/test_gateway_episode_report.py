"""An agent's ``report_episode`` metrics and info reach its Trajectory, from an async solve,
a sync one (in its worker thread) and one that raises; nothing leaks between episodes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.gateway import AgentRunner, Gateway, GatewayLimits
from agentrl.reporting.episode import collect_episode_report, report_episode
from agentrl.testing.scripted_server import TextPolicy
from agentrl.types import StopReason
from tests.helpers.gateway import Recording


async def run(tokenizer: Any, solve: Any, n: int = 1) -> list[Any]:
    llm = Recording(TextPolicy(tokenizer, lambda p: "ok"))
    async with Gateway(llm, tokenizer, GatewayLimits()) as gw:
        runner = AgentRunner(gw, solve)
        return list(
            await asyncio.gather(
                *(runner.run_episode({"k": k}, episode_id=f"e{k}") for k in range(n))
            )
        )


async def test_an_async_agents_report_reaches_its_own_trajectory(tokenizer):
    async def solve(task, client):
        await asyncio.sleep(0.01 * (2 - task["k"]))
        report_episode({"graded": 1, "k": task["k"]}, {"patch": f"diff {task['k']}"})
        return 0.5

    trajs = await run(tokenizer, solve, n=2)
    for k, t in enumerate(trajs):
        assert t.metrics["graded"] == 1.0 and t.metrics["k"] == float(k)
        assert t.info["patch"] == f"diff {k}" and t.reward == 0.5


async def test_a_sync_agent_reports_from_its_thread_and_a_raising_one_keeps_its_report(tokenizer):
    def solve(task, client):
        report_episode({"commands": 3.0}, {"exit_status": "Submitted"})
        return 1.0

    [t] = await run(tokenizer, solve)
    assert t.metrics["commands"] == 3.0 and t.info["exit_status"] == "Submitted"

    async def broken(task, client):
        report_episode({"commands": 2.0})
        raise RuntimeError("boom")

    [t] = await run(tokenizer, broken)
    assert t.stop_reason == StopReason.AGENT_ERROR and t.metrics["commands"] == 2.0


def test_outside_an_episode_reporting_does_nothing_and_non_numbers_are_refused():
    report_episode({"x": 1.0}, {"y": 2})  # no episode: ignored
    with collect_episode_report() as report:
        report_episode({"x": 1}, {"y": 2})
        report_episode({"x": 2.5})
        with pytest.raises(TypeError, match="'bad' must be a number"):
            report_episode({"bad": "1"})
    assert report.metrics == {"x": 2.5} and report.info == {"y": 2}
    with collect_episode_report() as fresh:
        pass
    assert fresh.metrics == {} and fresh.info == {}
