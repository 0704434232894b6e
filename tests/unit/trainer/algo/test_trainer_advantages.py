"""Advantage estimators against values derived by hand."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer.algo.advantages import (
    AdvantageInputs,
    compute_advantages,
    gae,
    returns_to_go,
)

# Three episodes in group 0 with outcome rewards 1, 0, 0 and two in group 1 with 2, 2.
# Row lengths (model tokens): 2, 3, 1, 2, 1 (R = 3); the outcome sits on the last token.
LENS = [2, 3, 1, 2, 1]
REWARDS = [1.0, 0.0, 0.0, 2.0, 2.0]
GROUPS = [0, 0, 0, 1, 1]


def _inputs(lens=LENS, rewards=REWARDS, groups=GROUPS, **kw):
    B, R = len(lens), max(lens)
    mask = torch.zeros(B, R)
    rew = torch.zeros(B, R)
    for b, (n, r) in enumerate(zip(lens, rewards, strict=True)):
        mask[b, :n] = 1
        if n:
            rew[b, n - 1] = r
    return AdvantageInputs(
        rew, mask, torch.zeros(B, R, dtype=torch.long), torch.tensor(groups), **kw
    )


def _per_row(adv: torch.Tensor, lens=LENS) -> list[float]:
    # Every token of a row carries the same advantage; padding is 0.
    out = []
    for b, n in enumerate(lens):
        assert torch.allclose(adv[b, :n], adv[b, 0].expand(n), atol=1e-6)
        assert torch.all(adv[b, n:] == 0)
        out.append(float(adv[b, 0]) if n else 0.0)
    return out


def test_grpo_group_normalized() -> None:
    # Group 0: mean 1/3, unbiased std sqrt(((2/3)² + 2·(1/3)²)/2) = sqrt(1/3) = 0.57735.
    # A = (1 - 1/3)/0.57735 = 1.15470 ; (0 - 1/3)/0.57735 = -0.57735.
    # Group 1: rewards all equal → A = 0 / (0 + eps) = 0 (all-equal edge case).
    adv, _ = compute_advantages("grpo", _inputs())
    assert _per_row(adv) == pytest.approx([1.15470, -0.57735, -0.57735, 0.0, 0.0], abs=1e-4)


def test_grpo_no_std_and_whiten_switches() -> None:
    # norm_by_std=False: A = R - mean = 2/3, -1/3, -1/3, 0, 0.
    adv, _ = compute_advantages("grpo", _inputs(norm_by_std=False))
    assert _per_row(adv) == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0, 0], abs=1e-6)
    # whiten=True on top: token values [2/3,2/3, -1/3×3, -1/3, 0,0, 0] (9 tokens), mean 0;
    # unbiased var = (2·4/9 + 4·1/9)/8 = 12/72 = 1/6 → A / sqrt(1/6) = A · 2.44949.
    adv, _ = compute_advantages("grpo", _inputs(norm_by_std=False), whiten=True)
    s = math.sqrt(6)
    assert _per_row(adv) == pytest.approx([2 / 3 * s, -1 / 3 * s, -1 / 3 * s, 0, 0], abs=1e-4)


def test_dr_grpo_subtracts_mean_only() -> None:
    adv, _ = compute_advantages("dr_grpo", _inputs())
    assert _per_row(adv) == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0, 0], abs=1e-6)


def test_rloo_leave_one_out() -> None:
    # Group 0: b_0 = (0+0)/2 = 0 → 1 ; b_1 = (1+0)/2 → -0.5 ; b_2 → -0.5. Group 1: 2 - 2 = 0.
    adv, _ = compute_advantages("rloo", _inputs())
    assert _per_row(adv) == pytest.approx([1.0, -0.5, -0.5, 0.0, 0.0], abs=1e-6)


def test_singleton_group() -> None:
    # A group of one: mean 0, std 1 (verl's convention) → grpo A = R; rloo baseline 0 → A = R.
    x = _inputs(lens=[2], rewards=[0.7], groups=[5])
    assert _per_row(compute_advantages("grpo", x)[0], [2]) == pytest.approx([0.7], abs=1e-5)
    assert _per_row(compute_advantages("rloo", x)[0], [2]) == pytest.approx([0.7], abs=1e-6)


def test_reinforce_pp_batch_whitened_return() -> None:
    # Rows: 2 tokens with reward 1 (G = [1, 1]) and 1 token with reward 0 (G = [0]).
    # Token mean 2/3; unbiased var ((1/3)²·2 + (2/3)²)/2 = 1/3 → std 0.57735.
    # A = (1 - 2/3)/0.57735 = 0.57735 ; (0 - 2/3)/0.57735 = -1.15470.
    x = _inputs(lens=[2, 1], rewards=[1.0, 0.0], groups=[0, 1])
    adv, ret = compute_advantages("reinforce_pp", x)
    assert _per_row(adv, [2, 1]) == pytest.approx([0.57735, -1.15470], abs=1e-4)
    assert ret[0].tolist() == [1.0, 1.0]


def test_reinforce_pp_baseline() -> None:
    # Same group: mean (1+0)/2 = 0.5 → G - 0.5 = [0.5, 0.5 | -0.5]; token mean 1/6;
    # deviations [1/3, 1/3, -2/3], unbiased var (1/9+1/9+4/9)/2 = 1/3 → / 0.57735.
    x = _inputs(lens=[2, 1], rewards=[1.0, 0.0], groups=[0, 0])
    adv, _ = compute_advantages("reinforce_pp_baseline", x)
    assert _per_row(adv, [2, 1]) == pytest.approx([0.57735, -1.15470], abs=1e-4)


def test_gae_by_hand() -> None:
    # γ = 0.9, λ = 0.8; row 0: r = [0, 0, 1], V = [0.5, 0.2, 0.4]; row 1: one token, r = 2, V = 1.
    # δ2 = 1 + 0.9·0 - 0.4 = 0.6                    A2 = 0.6
    # δ1 = 0 + 0.9·0.4 - 0.2 = 0.16                 A1 = 0.16 + 0.72·0.6 = 0.592
    # δ0 = 0 + 0.9·0.2 - 0.5 = -0.32                A0 = -0.32 + 0.72·0.592 = 0.10624
    # returns = A + V = [0.60624, 0.792, 1.0]; row 1: δ = 2 - 1 = 1 → A = 1, return 2.
    r = torch.tensor([[0.0, 0.0, 1.0], [2.0, 0.0, 0.0]])
    v = torch.tensor([[0.5, 0.2, 0.4], [1.0, 9.0, 9.0]])  # 9.0 on padding must be ignored
    m = torch.tensor([[1.0, 1, 1], [1, 0, 0]])
    adv, ret = gae(r, v, m, 0.9, 0.8)
    torch.testing.assert_close(adv, torch.tensor([[0.10624, 0.592, 0.6], [1.0, 0.0, 0.0]]))
    assert ret[0].tolist() == pytest.approx([0.60624, 0.792, 1.0], abs=1e-5)
    assert ret[1].tolist() == pytest.approx([2.0, 0.0, 0.0], abs=1e-6)


def test_gae_registry_whitens_by_default_and_needs_values() -> None:
    x = _inputs(lens=[2, 1], rewards=[1.0, 0.0], groups=[0, 1])
    with pytest.raises(ValueError, match="critic"):
        compute_advantages("gae", x)
    x.values_BR = torch.zeros(2, 2)
    adv, _ = compute_advantages("gae", x)  # γ = λ = 1, V = 0 → A = G, then whitened
    assert _per_row(adv, [2, 1]) == pytest.approx([0.57735, -1.15470], abs=1e-4)


def test_returns_to_go_discounts_per_turn() -> None:
    # Tokens of turns [0, 0, 1, 1] with rewards [0, 0.2, 0, 1] and γ = 0.5:
    # G3 = 1; G2 = 0 + 1 = 1 (same turn, no discount); G1 = 0.2 + 0.5·1 = 0.7; G0 = 0.7.
    r = torch.tensor([[0.0, 0.2, 0.0, 1.0]])
    turn = torch.tensor([[0, 0, 1, 1]])
    G = returns_to_go(r, torch.ones(1, 4), turn, 0.5)
    torch.testing.assert_close(G, torch.tensor([[0.7, 0.7, 1.0, 1.0]]))


def test_per_turn_credit_in_grpo() -> None:
    # Two 2-turn episodes in one group, γ = 1. ep0: turns [t0 t0 | t1] with turn rewards
    # (1, 0) → G = [1, 1, 0]; ep1: turns [t0 | t1 t1] with rewards (0, 1) → G = [1, 1, 1].
    # Episode returns are both 1 (group mean 1), so dr_grpo A = G - 1 = [0, 0, -1], [0, 0, 0]:
    # only ep0's unrewarded second turn is blamed, which the episode total alone cannot say.
    r = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    turn = torch.tensor([[0, 0, 1], [0, 1, 1]])
    x = AdvantageInputs(r, torch.ones(2, 3), turn, torch.tensor([0, 0]))
    adv, _ = compute_advantages("dr_grpo", x)
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.0, -1.0], [0.0, 0.0, 0.0]]))


def test_fully_masked_row_is_zero() -> None:
    adv, ret = compute_advantages(
        "grpo", _inputs(lens=[2, 0, 1], rewards=[1.0, 0.0, 0.0], groups=[0, 0, 0])
    )
    assert torch.all(adv[1] == 0) and torch.all(ret[1] == 0)
    assert torch.isfinite(adv).all()


def test_unknown_estimator_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid: dr_grpo, gae, grpo, reinforce_pp"):
        compute_advantages("ppo_magic", _inputs())


# ----------------------------------------------------------------- issue #13 defects 1, 2, 6


@pytest.mark.parametrize(("value", "n"), [(0.7, 8), (0.1, 7), (2.7, 16)])
def test_grpo_group_of_equal_rewards_is_exactly_zero(value: float, n: int) -> None:
    # Defect 1: R - mean = 0 for every episode when all rewards are equal, so Â = 0 exactly.
    # float32 put the mean one ulp off and the std at about one ulp: 8 × 0.7 gave 0.056,
    # 7 × 0.1 gave 0.0074, 16 × 2.7 gave 0.32, all of one sign.
    x = _inputs(lens=[1] * n, rewards=[value] * n, groups=[0] * n)
    assert x.rewards_BR.dtype == torch.float32
    for name in ("grpo", "dr_grpo", "rloo"):
        adv, _ = compute_advantages(name, x)
        assert torch.count_nonzero(adv) == 0, name


# Four 2-turn episodes (one token per turn) whose turn rewards all total 1.0.
SPLIT = [[0.5, 0.5], [0.0, 1.0], [0.25, 0.75], [1.0, 0.0]]


def _two_turn(rewards: list[list[float]], **kw) -> AdvantageInputs:
    n = len(rewards)
    turn = torch.tensor([[0, 1]] * n)
    return AdvantageInputs(
        torch.tensor(rewards), torch.ones(n, 2), turn, torch.zeros(n, dtype=torch.long), **kw
    )


def test_grpo_per_turn_rewards_are_process_supervision() -> None:
    # Defect 2: (G_t - mean R)/std R gave -5e5 … -1e6 here (std of the totals is 0).
    # With process supervision every turn is a step (DeepSeekMath §4.1.3): the 8 step
    # rewards .5 .5 0 1 .25 .75 1 0 have mean .5, deviations 0 0 -.5 .5 -.25 .25 .5 -.5,
    # Σd² = 4·.25 + 2·.0625 = 1.125, sample std sqrt(1.125/7) = 0.400892.
    # Turn 1: Â = ρ̃_1 = (ρ_1 - .5)/σ = 0, 1.24722, 0.62361, -1.24722.
    # Turn 0: Â = ρ̃_0 + ρ̃_1 = (ρ_0 + ρ_1 - 1)/σ = 0 (the totals are equal).
    adv, _ = compute_advantages("grpo", _two_turn(SPLIT, process=True))
    s = math.sqrt(1.125 / 7)
    want = torch.tensor([[0.0, 0.0], [0.0, 0.5 / s], [0.0, 0.25 / s], [0.0, -0.5 / s]])
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=1e-5)


def test_grpo_outcome_supervision_credits_the_totals() -> None:
    # The same episodes under outcome supervision (the default): one step per episode, its
    # total, and the totals are all 1.0 → Â = 0 on every token.
    adv, _ = compute_advantages("grpo", _two_turn(SPLIT))
    assert torch.count_nonzero(adv) == 0


def test_grpo_supervision_never_switches_on_the_reward_values() -> None:
    # Issue #43: a group was made "process" by any non-zero earlier reward, so a 1e-9
    # shaping reward on turn 0 turned (R - mean)/std = ±0.707107 on both turns (totals
    # 1, 0) into 0 on turn 0: every advantage of the group moved by O(1). Under outcome
    # supervision the totals are 1 + 1e-9 and 0 → still ±0.707107 (to ~1e-9) on both turns.
    a = 0.5 / math.sqrt(0.5)
    want = torch.tensor([[a, a], [-a, -a]])
    for shaping in (0.0, 1e-9, -1e-9):
        adv, _ = compute_advantages("grpo", _two_turn([[shaping, 1.0], [0.0, 0.0]]))
        torch.testing.assert_close(adv, want, atol=1e-5, rtol=0)


def test_grpo_in_reward_kl_is_never_a_turn_reward() -> None:
    # kl.placement: reward puts β·KL on every token. Outcome: it only lowers the totals —
    # R = 1 - (.01 + .01) = .98 and 0 - (.02 + .02) = -.04 → mean .47, deviations ±.51,
    # sample std .51·√2 → ±0.707107 on both turns. (Read as turn rewards, turn 0's -.01 and
    # -.02 made the group "process" and gave turn 0 a different advantage than turn 1.)
    # Process: the penalty of the whole episode joins its last step: steps (0, .98) and
    # (0, -.04) → mean .235, deviations -.235 .745 -.235 -.275, Σd² = .0552250·2 + .555025
    # + .075625 = .741100, std √(.7411/3); turn 1: (ρ_1 - .235)/σ, turn 0 adds ρ̃_0.
    x = _two_turn([[0.0, 1.0], [0.0, 0.0]])
    x.penalty_BR = torch.tensor([[0.01, 0.01], [0.02, 0.02]])
    adv, _ = compute_advantages("grpo", x)
    a = 0.5 / math.sqrt(0.5)
    torch.testing.assert_close(adv, torch.tensor([[a, a], [-a, -a]]), atol=1e-5, rtol=0)
    x.process = True
    adv, _ = compute_advantages("grpo", x)
    s = math.sqrt(0.7411 / 3)
    t1 = [(0.98 - 0.235) / s, (-0.04 - 0.235) / s]
    t0 = [-0.235 / s + t1[0], -0.235 / s + t1[1]]
    want = torch.tensor([[t0[0], t1[0]], [t0[1], t1[1]]])
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=1e-5)


def test_in_reward_kl_is_subtracted_per_token_for_return_estimators() -> None:
    # dr_grpo on one one-turn group: R = 1 - .1 - .1 = .8 and 0 - .2 = -.2, mean .3;
    # G_t = return-to-go of the net rewards: ep0 [.8, .9] - .3, ep1 [-.2, -.1] - .3.
    x = _two_turn([[0.0, 1.0], [0.0, 0.0]])
    x.turn_BR = torch.zeros(2, 2, dtype=torch.long)
    x.penalty_BR = torch.tensor([[0.1, 0.1], [0.1, 0.1]])
    adv, _ = compute_advantages("dr_grpo", x)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.6], [-0.5, -0.4]]))


def test_grpo_per_turn_advantages_stay_within_the_bound() -> None:
    # |Â| ≤ sqrt(T·(N-1)) (T turns of the episode, N steps of the group; docs/trainer.md).
    # The review's near-degenerate case (small non-zero std) gave |Â| ≈ 59; random splits,
    # near-ties and all-equal groups must all stay inside the bound.
    g = torch.Generator().manual_seed(0)
    cases = [[[0.5, 0.5 + 1e-6], [0.0, 1.0], [0.25, 0.75], [1.0, 0.0]], [[0.3, 0.3]] * 4]
    cases += [torch.rand(6, 2, generator=g).round(decimals=1).tolist() for _ in range(50)]
    for rewards in cases:
        adv, _ = compute_advantages("grpo", _two_turn(rewards, process=True))
        assert float(adv.abs().max()) <= math.sqrt(2 * (2 * len(rewards) - 1)) + 1e-5


def test_grpo_outcome_reward_with_discount() -> None:
    # An outcome-only group (no reward before the last turn): Â_t = γ^(T-1-turn)·(R - mean)/std.
    # R = 1, 0 → mean .5, sample std 0.707107 → ±0.707107 on turn 1, ±0.353553 on turn 0 (γ=.5).
    # The old (γ^(T-1-turn)·R - mean R)/std gave 0 and -0.707 on turn 0: not bounded by the
    # group's spread (all R = 1 and γ < 1 → -(1-γ)/ε).
    adv, _ = compute_advantages("grpo", _two_turn([[0.0, 1.0], [0.0, 0.0]], gamma=0.5))
    a = 0.5 / math.sqrt(0.5)
    torch.testing.assert_close(adv, torch.tensor([[a / 2, a], [-a / 2, -a]]))
    adv, _ = compute_advantages("grpo", _two_turn([[0.0, 1.0], [0.0, 1.0]], gamma=0.5))
    assert torch.count_nonzero(adv) == 0


def test_discount_is_per_turn_for_returns_and_per_token_for_gae() -> None:
    # Defect 6 (chosen and documented): tokens [t0, t0, t1], reward 1 on the last, γ = 0.5.
    # Return-to-go (grpo, rloo, reinforce_pp…) discounts per model turn: G = [.5, .5, 1].
    # GAE (V = 0, λ = 1) discounts per model token: A = [.25, .5, 1].
    r = torch.tensor([[0.0, 0.0, 1.0]])
    m = torch.ones(1, 3)
    turn = torch.tensor([[0, 0, 1]])
    torch.testing.assert_close(returns_to_go(r, m, turn, 0.5), torch.tensor([[0.5, 0.5, 1.0]]))
    adv, _ = gae(r, torch.zeros(1, 3), m, 0.5, 1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.25, 0.5, 1.0]]))
