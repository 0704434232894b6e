"""Policy losses, aggregation, value loss and KL estimators against hand-derived values."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer.algo.kl import AdaptiveKLController, kl_estimate
from agentrl.trainer.algo.losses import (
    LossParams,
    agg_loss,
    agg_weights,
    compute_policy_loss,
    value_loss,
)
from agentrl.trainer.config import TrainerConfig

LN = math.log


def _ppo(
    name: str, ratios: list[float], adv: list[float], p: LossParams, mask: list[float] | None = None
):
    logp = torch.tensor([[LN(r) for r in ratios]], requires_grad=True)
    m = torch.tensor([mask or [1.0] * len(ratios)])
    out = compute_policy_loss(name, logp, torch.zeros_like(logp), torch.tensor([adv]), m, p)
    return out, logp


def test_ppo_clip_by_hand() -> None:
    # ε = 0.2; L = max(-A·r, -A·clip(r, 0.8, 1.2)):
    #  r=0.5, A=-1: max(0.5, 0.8) = 0.8   (clipped low)
    #  r=1.5, A=+1: max(-1.5, -1.2) = -1.2 (clipped high)
    #  r=1.1, A=+2: max(-2.2, -2.2) = -2.2
    #  r=0.5, A=+1: max(-0.5, -0.8) = -0.5 (pessimistic: not clipped)
    #  padding (mask 0) → 0
    out, logp = _ppo(
        "ppo", [0.5, 1.5, 1.1, 0.5, 3.0], [-1, 1, 2, 1, 5], LossParams(), [1, 1, 1, 1, 0]
    )
    assert out.loss_BR[0].tolist() == pytest.approx([0.8, -1.2, -2.2, -0.5, 0.0], abs=1e-6)
    assert out.indicators["clip_low"][0].tolist() == [1, 0, 0, 0, 0]
    assert out.indicators["clip_high"][0].tolist() == [0, 1, 0, 0, 0]
    # Gradients: clipped tokens get none; d(-A·r)/dlogp = -A·r for the others.
    out.loss_BR.sum().backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, -2.2, -0.5, 0.0], abs=1e-6)


def test_clip_higher() -> None:
    # r = 1.25, A = 1: symmetric ε=0.2 → -1.2 (clipped); DAPO ε_high = 0.28 → -1.25 (inside).
    sym, _ = _ppo("ppo", [1.25], [1.0], LossParams(0.2, 0.2))
    hi, _ = _ppo("ppo", [1.25], [1.0], LossParams(0.2, 0.28))
    assert float(sym.loss_BR.detach()) == pytest.approx(-1.2)
    assert float(hi.loss_BR.detach()) == pytest.approx(-1.25)


def test_dual_clip() -> None:
    # c = 3, A = -1: r=5 → max(5, 1.2) = 5 → min(5, 3) = 3 (dual clipped);
    # r=2 → max(2, 1.2) = 2 < 3 → 2; A = +1, r=5 → -1.2 (dual clip only acts on A < 0).
    out, _ = _ppo("dual_clip", [5.0, 2.0, 5.0], [-1, -1, 1], LossParams(dual_clip_c=3.0))
    assert out.loss_BR[0].tolist() == pytest.approx([3.0, 2.0, -1.2], abs=1e-6)
    assert out.indicators["dual_clip"][0].tolist() == [1, 0, 0]


def test_gspo_sequence_ratio() -> None:
    # Token ratios 1.1 and 1.3 → s = exp(mean log) = sqrt(1.43) = 1.195826; the third token is
    # padding and must not enter the mean. A = 1, ε_high 0.2 → unclipped: loss -1.195826 per token
    # and d/dlogp_t = -A·s = -1.195826 on each real token; ε_high 0.1 → clipped at -1.1, no grad.
    out, logp = _ppo("gspo", [1.1, 1.3, 7.0], [1, 1, 1], LossParams(0.2, 0.2), [1, 1, 0])
    assert out.loss_BR[0].tolist() == pytest.approx([-1.195826, -1.195826, 0.0], abs=1e-5)
    out.loss_BR.sum().backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([-1.195826, -1.195826, 0.0], abs=1e-5)
    clipped, _ = _ppo("gspo", [1.1, 1.3], [1, 1], LossParams(0.1, 0.1))
    assert clipped.loss_BR[0].tolist() == pytest.approx([-1.1, -1.1], abs=1e-6)


def test_pg_is_minus_advantage_logprob() -> None:
    # L = -A·log π: value -A (the ratio is exp(0) = 1) and gradient -A per token.
    out, logp = _ppo("pg", [0.3, 2.0], [2.0, -0.5], LossParams())
    assert out.loss_BR[0].tolist() == pytest.approx([-2.0, 0.5])
    out.loss_BR.sum().backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([-2.0, 0.5])


def test_unknown_loss_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid: dual_clip, gspo, pg, ppo"):
        compute_policy_loss(
            "trpo", torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1)
        )


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 2 fully masked


def test_aggregation_modes() -> None:
    # token-mean: (1+2+3+4)/4 = 2.5
    assert float(agg_loss(LOSS, MASK, "token-mean")) == pytest.approx(2.5)
    # seq-mean-token-mean: (6/3 + 4/1) / 2 episodes with tokens = 3
    assert float(agg_loss(LOSS, MASK, "seq-mean-token-mean")) == pytest.approx(3.0)
    # seq-mean-token-sum-norm: (6 + 4) / (2 · L) with the constant L = 4 → 1.25
    assert float(agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", 4)) == pytest.approx(1.25)
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(LOSS, MASK, "sum")


def test_aggregation_single_token_and_empty() -> None:
    one = torch.tensor([[5.0]])
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert float(agg_loss(one, torch.ones(1, 1), mode, 1)) == pytest.approx(5.0)
        assert float(agg_loss(one, torch.zeros(1, 1), mode, 1)) == 0.0  # nothing to learn, no NaN


def test_value_loss_clipping() -> None:
    # ε_v = 0.2. Token 0: V=1.0, V_old=0.5, R=2: (V-R)² = 1; clipped V = 0.7 → (0.7-2)² = 1.69;
    #   loss ½·max = 0.845, clipped. Token 1: V=0.6, V_old=0.5, R=0: both 0.36 → 0.18, not clipped.
    v = torch.tensor([[1.0, 0.6]])
    loss, clipped = value_loss(
        v, torch.tensor([[0.5, 0.5]]), torch.tensor([[2.0, 0.0]]), torch.ones(1, 2), 0.2
    )
    assert loss[0].tolist() == pytest.approx([0.845, 0.18])
    assert clipped[0].tolist() == [1.0, 0.0]
    unclipped, _ = value_loss(
        v, torch.tensor([[0.5, 0.5]]), torch.tensor([[2.0, 0.0]]), torch.ones(1, 2), None
    )
    assert unclipped[0].tolist() == pytest.approx([0.5, 0.18])


def test_value_clip_fraction_counts_only_tokens_outside_the_range() -> None:
    # Issue #43: |V - V_old| = 0.1818 < ε = 0.2, so the token is not clipped, but in float32
    # V_old + (V - V_old) is one ulp off V, its error to R is the larger, and the token was
    # counted as clipped (and its loss taken from the recomputed value).
    v = torch.tensor([[-0.12402170151472092]])
    v_old = torch.tensor([[-0.3059833347797394]])
    ret = torch.tensor([[1.563046932220459]])
    assert float(v_old + torch.clamp(v - v_old, -0.2, 0.2)) != float(v)  # the ulp is there
    loss, clipped = value_loss(v, v_old, ret, torch.ones(1, 1), 0.2)
    assert clipped.tolist() == [[0.0]]
    assert float(loss) == float(0.5 * (v - ret) ** 2)


def test_kl_estimators_by_hand() -> None:
    # log π = -1, log π_ref = -2 → log r = log(π_ref/π) = -1:
    # k1 = -log r = 1; k2 = ½(log r)² = 0.5; k3 = e^-1 - 1 + 1 = 0.367879.
    logp, ref = torch.tensor([[-1.0, -0.5]]), torch.tensor([[-2.0, -0.5]])
    assert kl_estimate(logp, ref, "k1")[0].tolist() == pytest.approx([1.0, 0.0])
    assert kl_estimate(logp, ref, "k2")[0].tolist() == pytest.approx([0.5, 0.0])
    assert kl_estimate(logp, ref, "k3")[0].tolist() == pytest.approx([0.367879, 0.0], abs=1e-6)
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_estimate(logp, ref, "k4")


def test_adaptive_kl_controller() -> None:
    # β = 0.1, target 0.1, horizon 100; observed KL 0.2 → e = clip(0.2/0.1 - 1, ±0.2) = 0.2;
    # after 10 samples β = 0.1·(1 + 0.2·10/100) = 0.102. Observed 0.05 → e = -0.5 → -0.2:
    # β = 0.102·(1 - 0.02) = 0.09996.
    c = AdaptiveKLController(0.1, target=0.1, horizon=100)
    c.update(0.2, n_steps=10)
    assert c.value == pytest.approx(0.102)
    c.update(0.05, n_steps=10)
    assert c.value == pytest.approx(0.09996)


# ----------------------------------------------------------------- issue #13 defects 4, 5, 7


def test_dr_grpo_normaliser_is_one_constant_for_every_mini_batch() -> None:
    # Defect 4: L used to be the longest row of each mini-batch. Mini-batch A has rows of 3 and
    # 1 tokens, mini-batch B one row of 1 token. With the constant L = 4 every token weighs
    # 1/(S·L): A → 1/(2·4) = 0.125, B → 1/(1·4) = 0.25 (the longest-row rule gave 1/(2·3) and
    # 1/(1·1): a token of B weighed 6× a token of A instead of 2×).
    mask_a = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    mask_b = torch.tensor([[1.0]])
    w_a = agg_weights(mask_a, "seq-mean-token-sum-norm", 4)
    w_b = agg_weights(mask_b, "seq-mean-token-sum-norm", 4)
    assert w_a[mask_a > 0].tolist() == pytest.approx([0.125] * 4)
    assert float(w_b[0, 0]) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="loss_norm_constant"):
        agg_weights(mask_b, "seq-mean-token-sum-norm")  # no silent per-batch constant
    # The config resolves L from the max response length, or says what to set.
    cfg = TrainerConfig(
        loss={"agg": "seq-mean-token-sum-norm"}, shaping={"max_response_tokens": 512}
    )
    assert cfg.loss.loss_norm_constant == 512
    with pytest.raises(ValueError, match=r"loss_norm_constant or shaping\.max_response_tokens"):
        TrainerConfig(loss={"agg": "seq-mean-token-sum-norm"})


def test_log_ratio_clamp_effect_is_the_documented_one() -> None:
    # Defect 5: the ±20 guard changes ppo only for A < 0 and log r > 20: loss -A·e^20, no
    # gradient. A = -1, log r = 25 → loss e^20 = 4.85165e8 (exact would be e^25), grad 0.
    # log r = 19 is exact: loss e^19 = 1.78482e8, d/dlogp = -A·r = e^19.
    logp = torch.tensor([[25.0, 19.0]], requires_grad=True)
    out = compute_policy_loss(
        "ppo", logp, torch.zeros(1, 2), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2)
    )
    assert out.loss_BR[0].tolist() == pytest.approx([math.exp(20), math.exp(19)], rel=1e-6)
    out.loss_BR.sum().backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([0.0, math.exp(19)], rel=1e-6)
    # With the dual clip (c = 3) both tokens are bounded at -c·A = 3 instead.
    dual = compute_policy_loss(
        "ppo", logp, torch.zeros(1, 2), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2),
        LossParams(dual_clip_c=3.0),
    )  # fmt: skip
    assert dual.loss_BR[0].tolist() == pytest.approx([3.0, 3.0])


def test_ppo_offers_the_dual_clip() -> None:
    # Defect 7: verl's PPO loss applies the dual clip (c = 3). ppo with dual_clip_c = 3, A = -1,
    # r = 5: max(5, 1.2) = 5 → min(5, 3) = 3 (was 5: ppo ignored c); r = 2 → 2; A = 1, r = 5 →
    # -1.2. Without dual_clip_c ppo stays the plain clip (5), and the config default is off.
    on, _ = _ppo("ppo", [5.0, 2.0, 5.0], [-1, -1, 1], LossParams(dual_clip_c=3.0))
    assert on.loss_BR[0].tolist() == pytest.approx([3.0, 2.0, -1.2], abs=1e-6)
    assert on.indicators["dual_clip"][0].tolist() == [1, 0, 0]
    off, _ = _ppo("ppo", [5.0], [-1], LossParams())
    assert off.loss_BR[0].tolist() == pytest.approx([5.0])
    assert TrainerConfig().loss.dual_clip_c is None
    assert TrainerConfig(loss={"dual_clip_c": 3}).loss.dual_clip_c == 3.0
