"""Tree-rollout leaves (``info["tree"]["node_ids"]``) → per-token tree nodes → tree_grpo."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.algo.advantages import AdvantageInputs, compute_advantages
from agentrl.trainer.engine.batch import build_batch
from agentrl.types import Trajectory, TurnSpan
from tests.helpers.trainer import tiny_lm


def _leaf(name: str, nodes: list[str] | None, reward: float, group: str = "g") -> Trajectory:
    # [p p | m m | o | m m m]: two model turns (2 and 3 model tokens).
    t = Trajectory(
        task_id="t",
        group_id=group,
        episode_id=name,
        token_ids=[1, 2, 3, 4, 5, 6, 7, 8],
        loss_mask=[0, 0, 1, 1, 0, 1, 1, 1],
        rollout_logprobs=[0.0] * 8,
        weight_versions=[-1, -1, 0, 0, -1, 0, 0, 0],
        spans=[
            TurnSpan(0, 2, "prompt"),
            TurnSpan(2, 4, "model"),
            TurnSpan(4, 5, "observation"),
            TurnSpan(5, 8, "model"),
        ],
        reward=reward,
    )
    if nodes is not None:
        t.info["tree"] = {"node_ids": nodes}
    return t


def _batch(leaves: list[Trajectory]):
    return build_batch(leaves, [t.reward for t in leaves], [False] * len(leaves))


def test_leaves_share_their_prefix_node() -> None:
    leaves = [_leaf("aa", ["A", "AA"], 1.0), _leaf("ab", ["A", "AB"], 0.0)]
    leaves.append(_leaf("solo", None, 0.0))  # outside the tree: one node of its own
    leaves.append(_leaf("other", ["A", "AA"], 0.0, group="h"))  # same ids, other group
    node = _batch(leaves).node_BR
    assert node is not None
    rows = [r[:5] for r in node.tolist()]
    assert rows[0][:2] == rows[1][:2] and len(set(rows[0][:2])) == 1  # turn 0: shared A
    assert len(set(rows[0][2:])) == 1 and len(set(rows[1][2:])) == 1
    assert rows[0][2] != rows[1][2] and rows[0][2] != rows[0][0]  # turn 1: AA vs AB
    assert len(set(rows[2])) == 1 and rows[2][0] not in rows[0] + rows[1]
    assert not set(rows[3]) & set(rows[0])  # group h's "A" is not group g's


def test_no_tree_no_nodes_and_bad_count_is_named() -> None:
    assert _batch([_leaf("x", None, 1.0)]).node_BR is None
    with pytest.raises(ValueError, match=r"trajectory bad .*1 ids for 2 model turns"):
        _batch([_leaf("bad", ["A"], 1.0)])


def test_depth_2_width_2_tree_end_to_end() -> None:
    """The tree of test_trainer_tree_grpo from real trajectories: leaves AA, AB, BA, BB
    with outcomes 1, 0, 0, 0; no std: turn 0 gets ±1/4 (A, B), turn 1 gets AA 1/2,
    AB -1/2, BA 0, BB 0 (V(A) = 1/2, V(B) = 0, V(root) = 1/4)."""
    names = [("A", "AA"), ("A", "AB"), ("B", "BA"), ("B", "BB")]
    leaves = [_leaf(b, [a, b], r) for (a, b), r in zip(names, [1.0, 0, 0, 0], strict=True)]
    b = _batch(leaves)
    x = AdvantageInputs(b.rewards_BR, b.mask_BR, b.turn_BR, b.group_B, norm_by_std=False)
    x.node_BR = b.node_BR
    adv, _ = compute_advantages("tree_grpo", x)
    want = torch.tensor(
        [
            [0.25, 0.25, 0.5, 0.5, 0.5],
            [0.25, 0.25, -0.5, -0.5, -0.5],
            [-0.25, -0.25, 0.0, 0.0, 0.0],
            [-0.25, -0.25, 0.0, 0.0, 0.0],
        ]
    )
    assert torch.equal(adv, want)


def test_a_trainer_step_credits_the_tree() -> None:
    """``advantage.estimator: tree_grpo`` in a Trainer step: the same four leaves, with the
    std (1/2): AA's turn 1 gets the largest, 1/2 / (1/2) = 1, AB's the smallest, -1 (grpo
    would give AA 3/2 on every token)."""
    names = [("A", "AA"), ("A", "AB"), ("B", "BA"), ("B", "BB")]
    leaves = [_leaf(b, [a, b], r) for (a, b), r in zip(names, [1.0, 0, 0, 0], strict=True)]
    cfg = {"advantage": {"estimator": "tree_grpo"}, "correction": {"mode": "bypass"}}
    m = Trainer(TrainerConfig(**cfg), tiny_lm()).step(leaves)
    assert (m["adv/max"], m["adv/min"]) == pytest.approx((1.0, -1.0), abs=1e-4)
