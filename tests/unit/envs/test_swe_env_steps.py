"""SweEnv.step: when it grades (submit, idle turns, turn limit) and when it nudges (no Docker)."""

from __future__ import annotations

from agentrl.envs.swe import GradeResult, SweEnv
from agentrl.types import Action, ToolCall


class Graded(SweEnv):
    """SweEnv whose grading is a stub counting calls."""

    def __init__(self, max_idle_turns: int = 2) -> None:
        super().__init__(max_idle_turns=max_idle_turns)
        self.grades = 0

    async def grade(self) -> GradeResult:
        self.grades += 1
        return GradeResult(1.0, True, True, 0, 3, 0)


TOOL = Action(text="", tool_calls=(ToolCall("bash", {"command": "ls"}, "c0"),))
IDLE = Action(text="thinking")


async def test_submit_grades_and_terminates() -> None:
    env = Graded()
    env._submitted = True
    r = await env.step(TOOL)
    assert r.terminated and r.reward == 1.0 and env.grades == 1
    assert r.info["swe_ended_by"] == "submit" and r.metrics["swe_resolved"] == 1.0


async def test_idle_turns_are_nudged_then_graded() -> None:
    env = Graded(max_idle_turns=2)
    for _ in range(2):
        r = await env.step(IDLE)
        assert not r.terminated and "submit" in r.observation[0].content
    assert not (await env.step(TOOL)).observation  # a tool turn resets the count
    await env.step(IDLE)
    await env.step(IDLE)
    r = await env.step(IDLE)
    assert r.terminated and r.info["swe_ended_by"] == "no_tool_calls" and env.grades == 1


async def test_turn_limit_grades() -> None:
    env = Graded()
    env.max_turns = 3
    assert not (await env.step(TOOL)).terminated
    assert not (await env.step(TOOL)).terminated
    r = await env.step(TOOL)
    assert r.terminated and r.info["swe_ended_by"] == "turn_limit"
