"""RolloutRunner: groups, bounded concurrency, and no lost episodes."""

from __future__ import annotations

import asyncio

from agentrl import Env, StepResult, StopReason
from agentrl.rollout import AgentLoop, RolloutRunner
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy


class Counting(Env):
    """Tracks how many episodes are in flight at once; fails on tasks marked bad."""

    live = 0
    peak = 0

    async def reset(self, task, *, seed=None):
        if task.get("bad"):
            raise RuntimeError(f"bad task {task['id']}")
        Counting.live += 1
        Counting.peak = max(Counting.peak, Counting.live)
        self.counted = True
        await asyncio.sleep(0.01)
        return f"task {task['id']}"

    async def step(self, action):
        return StepResult(reward=float(len(action.text) > 0), terminated=True)

    def close(self):
        if getattr(self, "counted", False):
            Counting.live -= 1


async def test_groups_share_ids_and_nothing_is_lost(tokenizer):
    loop = AgentLoop(ScriptedLLM(TextPolicy(tokenizer, lambda _: "done")), tokenizer)
    runner = RolloutRunner(loop, Counting, group_size=3, max_concurrency=4)
    tasks = [{"id": f"t{i}", "bad": i == 2} for i in range(5)]
    Counting.live = Counting.peak = 0
    result = await runner.run(tasks)

    assert [len(g) for g in result.groups] == [3] * 5
    for i, group in enumerate(result.groups):
        assert {t.task_id for t in group} == {f"t{i}"}
        assert len({t.group_id for t in group}) == 1
        assert len({t.episode_id for t in group}) == 3
    assert len({g[0].group_id for g in result.groups}) == 5
    # The bad task's episodes end with env_error; the others finish.
    assert result.stop_reasons == {"env_error": 3, "done": 12}
    assert all(t.stop_reason == StopReason.ENV_ERROR for t in result.groups[2])
    assert result.metrics["stop/env_error"] == 3 and result.metrics["episodes"] == 15
    assert result.metrics["reward_mean"] == 12 / 15
    assert Counting.peak == 4 and Counting.live == 0


async def test_env_factory_failure_is_recorded(tokenizer):
    def factory():
        raise OSError("cannot build env")

    loop = AgentLoop(ScriptedLLM(TextPolicy(tokenizer, lambda _: "x")), tokenizer)
    result = await RolloutRunner(loop, factory, group_size=2).run([{"id": "a"}])
    assert [t.stop_reason for t in result.trajectories] == [StopReason.ENV_ERROR] * 2
    assert "cannot build env" in result.trajectories[0].error


async def test_stream_yields_each_group_when_done(tokenizer):
    class Slow(Counting):
        async def reset(self, task, *, seed=None):
            await asyncio.sleep(task["delay"])
            return "hi"

    loop = AgentLoop(ScriptedLLM(TextPolicy(tokenizer, lambda _: "x")), tokenizer)
    runner = RolloutRunner(loop, Slow, group_size=2)
    order = [
        g[0].task_id
        async for g in runner.stream([{"id": "slow", "delay": 0.3}, {"id": "fast", "delay": 0.0}])
    ]
    assert order == ["fast", "slow"]
