"""Reward shaping and filtering by hand."""

from __future__ import annotations

import pytest

from agentrl.trainer.algo.shaping import dynamic_filter, overlong_penalty, shape_rewards
from agentrl.trainer.config import ShapingConfig
from agentrl.types import StopReason
from tests.helpers.trainer import episode


def test_overlong_penalty_ramp() -> None:
    # L_max = 10, L_cache = 4 → no penalty up to 6 tokens, then -(n-6)/4, capped at -1.
    assert [overlong_penalty(n, 10, 4) for n in (5, 6, 8, 10, 12)] == pytest.approx(
        [0.0, 0.0, -0.5, -1.0, -1.0]
    )
    assert overlong_penalty(8, 10, 4, factor=0.5) == pytest.approx(-0.25)


def test_shaping_pipeline() -> None:
    # ep0: 8 model tokens, reward 1 → overlong -0.5 → 0.5.
    # ep1: 3 tokens, truncated, reward 1 → stop-properly × 0.3 → 0.3.
    # ep2: 3 tokens, reward 5 → clipped to 2.
    trajs = [
        episode(0, "a", [1], [2] * 8, 1.0),
        episode(1, "a", [1], [2] * 3, 1.0, stop=StopReason.MAX_TOKENS),
        episode(2, "b", [1], [2] * 3, 5.0),
    ]
    cfg = ShapingConfig(
        max_response_tokens=10, overlong_buffer=4, stop_properly_coef=0.3, reward_clip=2.0
    )
    s = shape_rewards(trajs, cfg)
    assert s.scores == pytest.approx([0.5, 0.3, 2.0])
    assert s.truncated == [False, True, False]
    assert s.metrics["shaping/overlong_penalized"] == 1.0


def test_reward_normalization_uses_the_sample_std() -> None:
    # Issue #13 defect 6: the same std as GRPO (Bessel-corrected). [1, 3]: mean 2,
    # sample std sqrt((1 + 1)/1) = √2 → [-1/√2, 1/√2] = ±0.707107 (population std gave ±1).
    trajs = [episode(0, "a", [1], [2], 1.0), episode(1, "b", [1], [2], 3.0)]
    s = shape_rewards(trajs, ShapingConfig(reward_normalize=True))
    assert s.scores == pytest.approx([-0.707107, 0.707107], abs=1e-6)


def test_dynamic_filter_drops_all_equal_groups() -> None:
    # Group a: [1, 1] (no signal, dropped); b: [0, 1] kept; c: a single episode, kept.
    kept, dropped = dynamic_filter(["a", "b", "a", "b", "c"], [1.0, 0.0, 1.0, 1.0, 0.5])
    assert kept == [1, 3, 4] and dropped == 1
    trajs = [
        episode(i, g, [1], [2], r)
        for i, (g, r) in enumerate([("a", 1.0), ("a", 1.0), ("b", 0.0), ("b", 1.0)])
    ]
    s = shape_rewards(trajs, ShapingConfig(dynamic_filter=True))
    assert s.kept == [2, 3] and s.metrics["filter/dropped_groups"] == 1.0


def test_overlong_buffer_needs_max_len() -> None:
    with pytest.raises(ValueError, match="max_response_tokens"):
        ShapingConfig(overlong_buffer=4)
