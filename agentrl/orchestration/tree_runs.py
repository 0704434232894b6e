"""A run with ``rollout.tree``: the start-up checks and the tree spec the RolloutRunner gets.

Before anything starts: the env must be able to fork (``fork_problem``, one message
naming the env and the reason), the episodes must run in the AgentLoop (not a
bring-your-own agent), and the estimator should credit the tree: ``grpo`` (the default)
becomes ``tree_grpo`` with a notice; another estimator is kept with a warning that it
trains the leaves as independent episodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from agentrl.config import RunConfig
from agentrl.env import Env, fork_problem
from agentrl.errors import UserError
from agentrl.rollout import TreeSpec

__all__ = ["resolve_tree", "tree_spec"]

_log = logging.getLogger(__name__)


def tree_spec(cfg: RunConfig) -> TreeSpec | None:
    """The RolloutRunner's tree shape for ``cfg.rollout.tree`` (None: flat groups)."""
    t = cfg.rollout.tree
    if t is None:
        return None
    return TreeSpec(
        branch_at=t.branch_at,
        width=t.width,
        max_leaves=t.max_leaves,
        max_tree_tokens=t.max_tree_tokens,
    )


def resolve_tree(cfg: RunConfig, env_cls: type[Env], say: Callable[[str], None]) -> RunConfig:
    """Checks a tree run before anything starts and resolves its estimator.

    Raises:
        UserError: The env cannot fork (its name and the reason), or ``agent.solve`` is set.
    """
    if cfg.rollout.tree is None:
        return cfg
    problem = fork_problem(env_cls)
    if problem is not None:
        raise UserError(
            f"rollout.tree: {problem}. Tree rollouts fork the env at each branch point; "
            "make the env forkable (Env.fork) or unset rollout.tree"
        )
    if cfg.agent.solve:
        raise UserError(
            "rollout.tree: a bring-your-own agent (agent.solve) cannot be forked mid-episode; "
            "unset rollout.tree or agent.solve"
        )
    adv = cfg.trainer.advantage
    if adv.estimator == "tree_grpo":
        return cfg
    if adv.estimator != "grpo":
        _log.warning(
            "rollout.tree with trainer.advantage.estimator=%s: the leaves are trained as "
            "independent episodes (only tree_grpo credits each turn by its siblings)",
            adv.estimator,
        )
        return cfg
    say("rollout.tree: trainer.advantage.estimator grpo -> tree_grpo (turns credited by subtree)")
    trainer = cfg.trainer.model_copy(
        update={"advantage": adv.model_copy(update={"estimator": "tree_grpo"})}
    )
    return cfg.model_copy(update={"trainer": trainer})
