"""Env roles through the AgentLoop: each turn asks for its role's adapter and records it.

Runs the two-role example (examples/solver_checker) against the scripted LLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl import Env, Message, StepResult, StopReason
from agentrl.inference.protocol import Generation, SamplingParams
from agentrl.loading.envs import resolve_env
from agentrl.reporting.run_dir import read_trajectories, write_trajectories
from agentrl.rollout import AgentLoop, LoopConfig
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy

CALL = '<tool_call>{"name": "calc", "arguments": {"expression": "17 * 23"}}</tool_call>'


class RoleRecordingLLM(ScriptedLLM):
    """The scripted LLM, remembering the adapter role of every request."""

    def __init__(self, policy: Any) -> None:
        super().__init__(policy)
        self.adapter_roles: list[str | None] = []

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        session_id: str | None = None,
        adapter_role: str | None = None,
    ) -> Generation:
        self.adapter_roles.append(adapter_role)
        return await super().generate(prompt_ids, params, session_id=session_id)


def _model_roles(traj: Any) -> list[str]:
    return [s.role for s in traj.spans if s.kind == "model"]


async def test_each_turn_asks_for_and_records_its_role(tokenizer, tmp_path: Path) -> None:
    env_cls = resolve_env("examples/solver_checker/env.py:SolveAndCheck")
    assert env_cls.roles == ("solver", "checker")
    replies = iter(
        [
            CALL, "ANSWER: 390", "VERDICT: wrong",  # solver uses calc, errs; checker objects
            "ANSWER: 391", CALL, "VERDICT: correct",  # solver fixes it; checker checks
            "ANSWER: 12", "VERDICT: correct",  # second episode: a wrong answer let through
        ]
    )  # fmt: skip
    llm = RoleRecordingLLM(TextPolicy(tokenizer, lambda _: next(replies)))
    loop = AgentLoop(llm, tokenizer, LoopConfig(role_adapters=True))  # trainer.lora.per_role
    task = env_cls().example_task()
    first = await loop.run(env_cls(), task, episode_id="a")
    assert first.stop_reason == StopReason.DONE and first.reward == 1.0
    want = ["solver", "solver", "checker", "solver", "checker", "checker"]
    assert _model_roles(first) == want
    assert llm.adapter_roles == want
    assert [m.content for m in first.messages if m.role == "tool"] == ["391", "391"]

    second = await loop.run(env_cls(), task, episode_id="b")
    assert second.reward == 0.0 and _model_roles(second) == ["solver", "checker"]
    assert llm.adapter_roles[len(want) :] == ["solver", "checker"]

    path = tmp_path / "trajectories.parquet"
    write_trajectories([first, second], path)
    back = read_trajectories(path)
    assert [_model_roles(t) for t in back] == [want, ["solver", "checker"]]
    assert first.to_dict()["spans"][1]["role"] == "solver"


async def test_without_role_adapters_the_roles_are_recorded_but_not_asked_for(tokenizer):
    env_cls = resolve_env("examples/solver_checker/env.py:SolveAndCheck")
    replies = iter(["ANSWER: 391", "VERDICT: correct"])
    llm = RoleRecordingLLM(TextPolicy(tokenizer, lambda _: next(replies)))
    traj = await AgentLoop(llm, tokenizer).run(env_cls(), env_cls().example_task())
    assert traj.reward == 1.0 and _model_roles(traj) == ["solver", "checker"]
    assert llm.adapter_roles == [None, None]  # one policy plays both parts


class NoRoles(Env):
    max_turns = 1

    def reset(self, task, *, seed=None):
        return [Message.user("hi")]

    def step(self, action):
        return StepResult(reward=1.0, terminated=True)


class BadRole(NoRoles):
    roles = ("a", "b")

    def role(self) -> str:
        return "c"


async def test_an_env_without_roles_asks_for_no_adapter(tokenizer) -> None:
    llm = RoleRecordingLLM(TextPolicy(tokenizer, lambda _: "hello"))
    traj = await AgentLoop(llm, tokenizer, LoopConfig(role_adapters=True)).run(NoRoles(), {})
    assert traj.stop_reason == StopReason.DONE
    assert llm.adapter_roles == [None] and _model_roles(traj) == [""]
    assert NoRoles().role() == "" and BadRole.roles == ("a", "b")


async def test_a_role_the_env_does_not_declare_ends_the_episode(tokenizer) -> None:
    llm = RoleRecordingLLM(TextPolicy(tokenizer, lambda _: "hello"))
    traj = await AgentLoop(llm, tokenizer).run(BadRole(), {})
    assert traj.stop_reason == StopReason.ENV_ERROR and llm.adapter_roles == []
    assert traj.error is not None and "BadRole.role() returned 'c'" in traj.error
