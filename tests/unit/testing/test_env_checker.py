"""check_env catches what gymnasium's checker would: bad return types, nondeterminism, bad tools."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agentrl import Env, Message, StepResult
from agentrl.testing import EnvCheckError, check_env
from agentrl.testing.env_checker import EnvCheckWarning, acheck_env
from agentrl.tools import tool


class Good(Env):
    def reset(self, task, *, seed=None):
        self.n = random.Random(seed).randint(0, 100)
        return [Message.system("Be brief."), Message.user(f"Say {self.n}.")]

    def step(self, action):
        return StepResult(reward=float(str(self.n) in action.text), terminated=True)


class AsyncGood(Env):
    async def reset(self, task, *, seed=None):
        return "Say hi."

    async def step(self, action):
        return StepResult(reward=0.0, terminated=True)

    async def close(self):
        self.closed = True


def make(**methods: Any) -> Env:
    """A Good env with some methods replaced."""
    return type("Custom", (Good,), methods)()


def test_good_sync_env_passes() -> None:
    check_env(Good())
    check_env(Good)  # a class is instantiated


def test_good_async_env_passes_and_closes() -> None:
    env = AsyncGood()
    check_env(env)
    assert env.closed


async def test_works_inside_a_running_event_loop() -> None:
    check_env(AsyncGood())
    assert await acheck_env(Good()) == []


def test_step_returning_gym_tuple() -> None:
    env = make(step=lambda self, a: ([], 1.0, True, False, {}))
    with pytest.raises(EnvCheckError, match=r"step\(action\) returned a tuple of 5.*StepResult"):
        check_env(env)


@pytest.mark.parametrize("reward", ["1.0", None, float("nan"), True])
def test_non_float_reward(reward: Any) -> None:
    env = make(step=lambda self, a: StepResult(reward=reward, terminated=True))
    with pytest.raises(EnvCheckError, match="reward must be"):
        check_env(env)


def test_int_reward_only_warns() -> None:
    env = make(step=lambda self, a: StepResult(reward=1, terminated=True))
    with pytest.warns(EnvCheckWarning, match="reward is a int"):
        check_env(env)


def test_non_bool_flag() -> None:
    env = make(step=lambda self, a: StepResult(terminated=1))  # type: ignore[arg-type]  # wrong on purpose
    with pytest.raises(EnvCheckError, match="terminated must be a bool"):
        check_env(env)


@pytest.mark.parametrize(
    ("out", "match"),
    [
        (42, "must return a list of agentrl.Message or a str, got int"),
        ((0, {}), r"returned an \(observation, info\) tuple"),
        ([], "returned no messages"),
        ([{"role": "user", "content": "hi"}], r"\[0\] is a dict.*Message.from_dict"),
        ([Message("robot", "hi")], "role 'robot'"),
    ],
)
def test_reset_returning_garbage(out: Any, match: str) -> None:
    env = make(reset=lambda self, task, *, seed=None: out)
    with pytest.raises(EnvCheckError, match=match):
        check_env(env)


def test_reset_without_seed_keyword() -> None:
    env = make(reset=lambda self, task: [Message.user("x")])
    with pytest.raises(EnvCheckError, match="must accept a keyword argument seed"):
        check_env(env)


def test_nondeterministic_reset() -> None:
    def reset(self: Any, task: Any, *, seed: Any = None) -> list[Message]:
        self.n = random.randint(0, 10**9)  # ignores the seed
        return [Message.user(f"Say {self.n}.")]

    with pytest.raises(EnvCheckError, match="reset is not deterministic"):
        check_env(make(reset=reset))


def test_nondeterministic_step() -> None:
    env = make(step=lambda self, a: StepResult(reward=random.random(), terminated=True))
    with pytest.raises(EnvCheckError, match=r"step is not deterministic.*reward"):
        check_env(env)


def test_raising_reset_and_close_are_reported() -> None:
    def boom(self: Any, *a: Any, **k: Any) -> None:
        raise ValueError("kaput")

    with pytest.raises(EnvCheckError, match=r"reset\(task, seed=0\) raised ValueError: kaput"):
        check_env(make(reset=boom))
    with pytest.raises(EnvCheckError, match="close\\(\\) raised ValueError: kaput"):
        check_env(make(close=boom))


def test_unimplemented_step() -> None:
    class NoStep(Env):
        def reset(self, task, *, seed=None):
            return "x"

    with pytest.raises(EnvCheckError, match=r"does not implement step"):
        check_env(NoStep())


def test_not_an_env() -> None:
    with pytest.raises(EnvCheckError, match=r"is not an agentrl\.Env"):
        check_env(object())  # type: ignore[arg-type]  # wrong on purpose


@tool
def add(a: int, b: int) -> int:
    """Adds two numbers.

    Args:
        a: First.
        b: Second.
    """
    return a + b


def test_valid_tools_pass() -> None:
    check_env(make(tools=lambda self: [add]))


@pytest.mark.parametrize(
    ("tools", "match"),
    [
        ([{"name": "f", "parameters": {}}], '"type": "function"'),
        ([{"type": "function", "function": {"name": "bad name"}}], "function.name must match"),
        (
            [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "description": "d",
                        "parameters": {"type": "object", "properties": {}, "required": ["x"]},
                    },
                }
            ],
            r"required names \['x'\]",
        ),
        ([add, add], "two tools are named 'add'"),
        (["python"], "is not a tool"),
    ],
)
def test_invalid_tools(tools: list[Any], match: str) -> None:
    with pytest.raises(EnvCheckError, match=match):
        check_env(make(tools=lambda self: tools))


def test_tool_without_description_warns() -> None:
    schema = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.warns(EnvCheckWarning, match="no description"):
        check_env(make(tools=lambda self: [schema]))


def test_task_and_example_task() -> None:
    seen: list[Any] = []

    def reset(self: Any, task: Any, *, seed: Any = None) -> str:
        seen.append(task)
        self.n = 1
        return "x"

    check_env(make(reset=reset), {"word": "a"})
    check_env(make(reset=reset, example_task=lambda self: {"word": "b"}))
    assert [t["word"] for t in seen] == ["a", "a", "b", "b"]
