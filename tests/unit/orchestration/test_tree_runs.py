"""rollout.tree at start-up: an env that cannot fork stops the run before anything starts,
the estimator becomes tree_grpo, and the config refuses a tree that does not fit the group."""

from __future__ import annotations

import logging

import pytest

from agentrl import Env
from agentrl.config import ConfigError, RunConfig, load_config
from agentrl.errors import UserError
from agentrl.orchestration.run import train
from agentrl.orchestration.tree_runs import resolve_tree, tree_spec
from agentrl.rollout import TreeSpec

TREE = {"tree": {"width": 2, "max_leaves": 4}}


class Rigid(Env):
    """An env that says it cannot fork."""

    forkable = False

    def reset(self, task, *, seed=None):
        return "hi"


class Plain(Env):
    def reset(self, task, *, seed=None):
        return "hi"


async def test_an_env_that_cannot_fork_stops_the_run_before_anything_starts() -> None:
    # An unreachable server: the run must stop before it would be asked for.
    cfg = RunConfig(
        env=f"{__name__}:Rigid", rollout=TREE, inference={"urls": ["http://127.0.0.1:9"]}
    )
    said: list[str] = []
    with pytest.raises(UserError) as err:
        await train(cfg, say=said.append)
    msg = str(err.value)
    assert msg.startswith("rollout.tree: ") and "Rigid cannot fork: it sets forkable = False" in msg
    assert said == []  # not even a run directory was made


def test_grpo_becomes_tree_grpo_and_other_estimators_warn(caplog) -> None:
    cfg = RunConfig(rollout=TREE)
    said: list[str] = []
    out = resolve_tree(cfg, Plain, said.append)
    assert out.trainer.advantage.estimator == "tree_grpo" and "tree_grpo" in said[0]
    assert cfg.trainer.advantage.estimator == "grpo"  # the input is unchanged
    rloo = RunConfig(rollout=TREE, trainer={"advantage": {"estimator": "rloo"}})
    with caplog.at_level(logging.WARNING):
        assert resolve_tree(rloo, Plain, said.append) is rloo
    assert "independent episodes" in caplog.text
    flat = RunConfig()
    assert resolve_tree(flat, Rigid, said.append) is flat and tree_spec(flat) is None
    assert tree_spec(cfg) == TreeSpec(branch_at="turns", width=2, max_leaves=4)


def test_an_agent_run_cannot_be_a_tree() -> None:
    cfg = RunConfig(rollout=TREE, agent={"solve": "examples.x:solve"})
    with pytest.raises(UserError, match=r"rollout.tree: a bring-your-own agent"):
        resolve_tree(cfg, Plain, print)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.tree={max_leaves: 3}", r"max_leaves \(3\) must divide rollout.group_size \(8\)"),
        ("rollout.tree={width: 1}", r"'rollout.tree.width': Input should be greater than or"),
        ("rollout.tree={branch_at: leaves}", r"'rollout.tree.branch_at'"),
        ("rollout.tree={wide: 2}", r"unknown key 'rollout.tree.wide'"),
        ("rollout.tree={max_tree_tokens: 0}", r"'rollout.tree.max_tree_tokens'"),
    ],
)
def test_bad_tree_settings_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])
