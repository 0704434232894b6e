"""The optional hooks are declared on Env; a near-miss name is flagged; the run calls what an
env defines, and only that."""

from __future__ import annotations

import warnings

import pytest

from agentrl import Env, Message, StepResult
from agentrl.config import load_config
from agentrl.env import HOOKS, provides
from agentrl.errors import TaskSpecError
from agentrl.orchestration.startup import load_tasks_for
from agentrl.testing import check_env
from agentrl.testing.env_checker import EnvCheckWarning


class Hi(Env):
    max_turns = 1

    def reset(self, task, *, seed=None):
        return [Message.user("Say hi.")]

    def step(self, action):
        return StepResult(reward=1.0, terminated=True)


class Typo(Hi):
    @staticmethod
    def default_task(split="train", n=4, seed=0):  # one letter short of default_tasks
        return [{"i": i} for i in range(n)]

    def exmaple_task(self):  # transposed letters
        return {}


class Generated(Hi):
    @staticmethod
    def default_tasks(split="train", n=4, seed=0):
        return [{"split": split, "i": i} for i in range(n)]


def test_every_hook_is_declared_and_documented_on_env() -> None:
    for hook in HOOKS:
        assert callable(getattr(Env, hook)), hook
        assert getattr(Env, hook).__doc__, hook
        assert not provides(Env, hook) and not provides(Hi, hook), hook


def test_provides_sees_hooks_a_class_defines_or_inherits_from_its_own_bases() -> None:
    assert provides(Generated, "default_tasks") and provides(Generated(), "default_tasks")

    class Sub(Generated):
        pass

    assert provides(Sub, "default_tasks") and not provides(Sub, "load_tasks")


def test_the_checker_warns_on_a_hook_name_one_typo_away() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        check_env(Typo())
    msgs = [str(w.message) for w in seen if issubclass(w.category, EnvCheckWarning)]
    assert any("'default_task'" in m and "'default_tasks'" in m for m in msgs), msgs
    assert any("'exmaple_task'" in m and "'example_task'" in m for m in msgs), msgs
    with warnings.catch_warnings(record=True) as clean:
        warnings.simplefilter("always")
        check_env(Generated())
    assert not [w for w in clean if issubclass(w.category, EnvCheckWarning)]


def test_a_run_uses_default_tasks_only_when_the_env_defines_it() -> None:
    cfg = load_config(None, ["eval.num_tasks=2", "task_kwargs={}"])
    train, held_out = load_tasks_for(cfg, Generated)
    assert {r["split"] for r in train} == {"train"} and len(held_out) == 2
    # The misspelled hook is not called: the run asks for a task file instead.
    with pytest.raises(TaskSpecError, match="no built-in tasks"):
        load_tasks_for(cfg, Typo)
