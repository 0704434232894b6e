"""Env.fork: the deep-copy default, its refusals naming the env and the attribute, and the
before-the-run check (fork_problem)."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from agentrl import Env, StepResult
from agentrl.env import EnvForkError, call_maybe_async, fork_problem


class Counter(Env):
    """Pure-Python state: forks by deep copy."""

    def __init__(self) -> None:
        self.history: list[str] = []
        self.state = {"count": 0, "seen": {"a"}}

    def reset(self, task, *, seed=None):
        return "count"

    def step(self, action):
        self.history.append(action.text)
        self.state["count"] += 1
        self.state["seen"].add(action.text)
        return StepResult(reward=0.0)


def test_default_fork_copies_state_that_then_diverges() -> None:
    parent = Counter()
    parent.history.append("t0")
    child = parent.fork()
    assert isinstance(child, Counter) and child is not parent
    assert child.history == ["t0"] and child.state == parent.state
    child.history.append("child")
    child.state["seen"].add("c")
    parent.state["count"] = 5
    assert parent.history == ["t0"] and "c" not in parent.state["seen"]
    assert child.state["count"] == 0
    assert fork_problem(parent) is None and fork_problem(Counter) is None


class Holder(Env):
    name = "holder"

    def __init__(self, thing: object) -> None:
        self.notes = ["ok"]
        self.deps = {"tools": [1, {"inner": thing}]}


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (threading.Lock, "_thread.lock"),
        (lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM), "socket.socket"),
        (lambda: open(__file__), "_io.TextIOWrapper"),  # noqa: SIM115 - closed below
    ],
)
def test_uncopyable_state_is_refused_naming_env_and_attribute(make, kind: str) -> None:
    thing = make()
    try:
        env = Holder(thing)
        why = fork_problem(env)
        assert why is not None
        assert why.startswith("holder (Holder) cannot fork: ")
        assert f"self.deps['tools'][1]['inner'] holds a {kind}" in why
        assert "override Holder.fork()" in why and "forkable = False" in why
        with pytest.raises(EnvForkError, match=r"self\.deps\['tools'\]\[1\]\['inner'\]") as e:
            env.fork()
        assert str(e.value) == why
        assert fork_problem(Holder) is None  # a class alone: decided at the fork
    finally:
        getattr(thing, "close", lambda: None)()


class Never(Env):
    forkable = False


class Overrides(Env):
    """Holds a lock, and knows how to fork anyway: makes a new one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log = [1]

    async def fork(self):
        child = Overrides()
        child.log = list(self.log)
        return child


def test_forkable_false_and_an_override_answer_for_themselves() -> None:
    assert fork_problem(Never) == "Never cannot fork: it sets forkable = False"
    assert fork_problem(Never()) == fork_problem(Never)
    with pytest.raises(EnvForkError, match="forkable = False"):
        Never().fork()
    assert fork_problem(Overrides) is None and fork_problem(Overrides()) is None
    parent = Overrides()
    child = asyncio.run(call_maybe_async(parent.fork))  # how a caller forks: sync or async
    child.log.append(2)
    assert parent.log == [1] and child.log == [1, 2] and child.lock is not parent.lock


def test_forkable_true_skips_the_trial_copy() -> None:
    class Trusted(Holder):
        forkable = True

    assert fork_problem(Trusted(threading.Lock())) is None
