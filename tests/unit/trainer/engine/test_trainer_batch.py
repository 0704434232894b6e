"""Trajectories → compact tensors, reward placement, token-budget micro-batching."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.engine.batch import (
    build_batch,
    make_micro_batch,
    partition_balanced,
    plan_micro_batches,
)
from agentrl.types import Trajectory, TurnSpan
from tests.helpers.trainer import episode


def _two_turn() -> Trajectory:
    # [p p | m m | o o | m m | o]: model turns at 2-3 (reward 0.25) and 6-7 (reward 0.5); the
    # second model span also covers the template token 8, which is not a model token.
    return Trajectory(
        task_id="t",
        group_id="g",
        episode_id="two-turn",
        token_ids=[1, 2, 3, 4, 5, 6, 7, 8, 9],
        loss_mask=[0, 0, 1, 1, 0, 0, 1, 1, 0],
        rollout_logprobs=[0, 0, -1.0, -2.0, 0, 0, -3.0, -4.0, 0],
        weight_versions=[-1, -1, 3, 3, -1, -1, 4, 4, -1],
        spans=[
            TurnSpan(0, 2, "prompt"),
            TurnSpan(2, 4, "model", 0.25),
            TurnSpan(4, 6, "observation"),
            TurnSpan(6, 9, "model", 0.5),
        ],
        reward=1.0,
    )


def test_multi_turn_reward_placement_and_turns() -> None:
    b = build_batch([_two_turn()], scores=[1.0], truncated=[False])
    assert b.pos_BR[0].tolist() == [2, 3, 6, 7]
    assert b.mask_BR[0].tolist() == [1, 1, 1, 1]
    assert b.rollout_logp_BR[0].tolist() == [-1.0, -2.0, -3.0, -4.0]
    assert b.versions_BR[0].tolist() == [3, 3, 4, 4]
    assert b.turn_BR[0].tolist() == [0, 0, 1, 1]
    # Turn rewards on each turn's last model token (span end 9 → token 7); the outcome
    # remainder 1.0 - 0.75 = 0.25 lands on the last model token: [0, 0.25, 0, 0.75].
    assert b.rewards_BR[0].tolist() == pytest.approx([0.0, 0.25, 0.0, 0.75])
    assert float(b.rewards_BR.sum()) == pytest.approx(1.0)


def test_sequence_reward_on_last_token_and_padding() -> None:
    b = build_batch(
        [episode(0, "a", [1, 2], [3, 4, 5], 2.0), episode(1, "a", [1], [9], -1.0)],
        scores=[2.0, -1.0],
        truncated=[False, True],
    )
    assert b.rewards_BR.tolist() == [[0.0, 0.0, 2.0], [-1.0, 0.0, 0.0]]
    assert b.mask_BR.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert b.group_B.tolist() == [0, 0]
    assert b.truncated_B.tolist() == [False, True]


def test_bad_trajectories_are_named() -> None:
    t = episode(0, "a", [1, 2], [3], 1.0)
    t.rollout_logprobs = t.rollout_logprobs[:-1]
    with pytest.raises(ValueError, match=r"trajectory ep0.*rollout_logprobs has 2"):
        build_batch([t], [1.0], [False])
    t0 = episode(7, "a", [], [3, 4], 1.0)  # the first token cannot be scored
    with pytest.raises(ValueError, match=r"ep7.*token 0"):
        build_batch([t0], [1.0], [False])


def test_partition_is_length_balanced() -> None:
    # LPT on lengths [10, 9, 3, 2, 2, 1] into 2 bins: 10→A, 9→B, 3→B (12), 2→A (12),
    # 2→A (tie → first bin, 14), 1→B (13).
    lengths = [10, 9, 3, 2, 2, 1]
    bins = partition_balanced(range(6), lengths, 2)
    assert bins == [[0, 3, 4], [1, 2, 5]]
    assert [sum(lengths[i] for i in b) for b in bins] == [14, 13]


def test_plan_by_token_budget() -> None:
    lengths = [10, 9, 3, 2, 2, 1]
    kw = dict(strategy="token_budget", micro_batch_size=2)
    # Budget 15: ceil(27/15) = 2 bins of 14 and 13 tokens fit.
    plan = plan_micro_batches(range(6), lengths, token_budget=15, packing=True, **kw)
    assert sorted(sum(lengths[i] for i in g) for g in plan) == [13, 14]
    # A row longer than the budget gets a micro-batch of its own.
    plan = plan_micro_batches(range(3), [30, 2, 2], token_budget=8, packing=True, **kw)
    assert [0] in plan and sum(len(g) for g in plan) == 3
    # Padded: rows × longest ≤ budget, length-sorted → [10], [9], [3, 2, 2, 1] (4·3 = 12 ≤ 12).
    plan = plan_micro_batches(range(6), lengths, token_budget=12, packing=False, **kw)
    assert plan == [[0], [1], [2, 3, 4, 5]]
    # Fixed: 2 rows each, in order; min_count pads with empty micro-batches.
    plan = plan_micro_batches(
        range(3),
        lengths,
        token_budget=1,
        packing=False,
        strategy="fixed",
        micro_batch_size=2,
        min_count=3,
    )
    assert plan == [[0, 1], [2], []]


def test_packed_micro_batch_layout() -> None:
    b = build_batch(
        [episode(0, "a", [5, 6], [7, 8], 1.0), episode(1, "a", [9], [10, 11, 12], 0.0)],
        scores=[1.0, 0.0],
        truncated=[False, False],
    )
    mb = make_micro_batch(b, [0, 1], packing=True)
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11, 12]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert mb.attention_mask is None
    # Token 7 (position 2) is predicted at flat index 1; episode 1 starts at offset 4.
    assert mb.sel_N.tolist() == [1, 2, 4, 5, 6]
    assert mb.targets_N.tolist() == [7, 8, 10, 11, 12]
    pad = make_micro_batch(b, [0, 1], packing=False)
    assert pad.input_ids.tolist() == [[5, 6, 7, 8], [9, 10, 11, 12]]
    assert pad.attention_mask is not None and pad.attention_mask.sum() == 8
    assert pad.sel_N.tolist() == [1, 2, 4, 5, 6]
    assert torch.equal(pad.targets_N, mb.targets_N)
