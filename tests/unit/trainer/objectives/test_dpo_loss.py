"""DPO / IPO losses against hand-derived values and gradients, and the DPO config."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer import TrainerConfig
from agentrl.trainer.objectives.preference import preference_loss, sequence_logp

# Two pairs' worth of rows is not needed: one pair, per-token log-probs with a padding
# column on the chosen row (mask 0) that must get neither loss nor gradient.
#   chosen   π: [-1, -2, pad]        Σ = -3, mean -1.5     π_ref: [-2, -2]        Σ -4, mean -2
#   rejected π: [-1, -1, -1, -2]     Σ = -5, mean -1.25    π_ref: [-1, -1, -1, -1] Σ -4, mean -1
BETA = 0.5
MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])


def _run(variant: str, length_norm: bool):
    logp = torch.tensor([[-1.0, -2.0, -7.0, 0.0], [-1.0, -1.0, -1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-2.0, -2.0, -9.0, 0.0], [-1.0, -1.0, -1.0, -1.0]])
    seq = sequence_logp(logp, MASK, length_norm)
    ref_seq = sequence_logp(ref, MASK, length_norm)
    out = preference_loss(
        seq[0:1], seq[1:2], ref_seq[0:1], ref_seq[1:2], beta=BETA, variant=variant
    )
    out.loss_P.sum().backward()
    assert logp.grad is not None
    return out, logp.grad


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_sigmoid_sum_values_and_gradient():
    # h = (-3 - -4) - (-5 - -4) = 1 - (-1) = 2;  L = -log σ(βh) = log(1 + e^{-1}).
    out, g = _run("sigmoid", length_norm=False)
    assert float(out.loss_P.detach()) == pytest.approx(math.log1p(math.exp(-1.0)), abs=1e-6)
    assert float(out.chosen_reward_P) == pytest.approx(0.5)  # β·(−3 − −4)
    assert float(out.rejected_reward_P) == pytest.approx(-0.5)  # β·(−5 − −4)
    assert float(out.margin_P) == pytest.approx(1.0)
    # ∂L/∂log π(y_w) = -β·σ(-βh), the same for each chosen token; +β·σ(-βh) for rejected.
    gw = -BETA * _sig(-1.0)
    torch.testing.assert_close(g[0], torch.tensor([gw, gw, 0.0, 0.0]))
    torch.testing.assert_close(g[1], torch.tensor([-gw] * 4))


def test_ipo_sum_values_and_gradient():
    # L = (h - 1/(2β))² = (2 - 1)² = 1; ∂L/∂log π(y_w) = 2(h - 1/(2β)) = 2, rejected -2.
    out, g = _run("ipo", length_norm=False)
    assert float(out.loss_P.detach()) == pytest.approx(1.0)
    assert float(out.margin_P) == pytest.approx(1.0)
    torch.testing.assert_close(g[0], torch.tensor([2.0, 2.0, 0.0, 0.0]))
    torch.testing.assert_close(g[1], torch.tensor([-2.0] * 4))


def test_sigmoid_length_normalised_values_and_gradient():
    # Means: h = (-1.5 - -2) - (-1.25 - -1) = 0.5 + 0.25 = 0.75; βh = 0.375.
    out, g = _run("sigmoid", length_norm=True)
    assert float(out.loss_P.detach()) == pytest.approx(math.log1p(math.exp(-0.375)), abs=1e-6)
    assert float(out.chosen_reward_P) == pytest.approx(0.25)  # β·0.5
    assert float(out.rejected_reward_P) == pytest.approx(-0.125)  # β·(-0.25)
    assert float(out.margin_P) == pytest.approx(0.375)
    # Each token's gradient is the sequence gradient divided by its length (2 and 4).
    s = BETA * _sig(-0.375)
    torch.testing.assert_close(g[0], torch.tensor([-s / 2, -s / 2, 0.0, 0.0]))
    torch.testing.assert_close(g[1], torch.tensor([s / 4] * 4))


def test_ipo_length_normalised_values_and_gradient():
    # L = (0.75 - 1)² = 0.0625; ∂L/∂mean_w = 2(0.75 - 1) = -0.5 → -0.25 per chosen token,
    # ∂L/∂mean_l = +0.5 → +0.125 per rejected token.
    out, g = _run("ipo", length_norm=True)
    assert float(out.loss_P.detach()) == pytest.approx(0.0625)
    torch.testing.assert_close(g[0], torch.tensor([-0.25, -0.25, 0.0, 0.0]))
    torch.testing.assert_close(g[1], torch.tensor([0.125] * 4))


def test_sigmoid_is_stable_for_large_margins():
    big = torch.tensor([1000.0])
    zero = torch.zeros(1)
    lo = preference_loss(-big, zero, zero, zero, beta=1.0)  # h = -1000: loss ≈ 1000
    hi = preference_loss(big, zero, zero, zero, beta=1.0)  # h = 1000: loss ≈ 0
    assert float(lo.loss_P.detach()) == pytest.approx(1000.0)
    assert float(hi.loss_P.detach()) == pytest.approx(0.0, abs=1e-12)


def test_bad_variant_and_beta_are_errors():
    z = torch.zeros(1)
    with pytest.raises(ValueError, match=r"unknown DPO variant 'kto'.*sigmoid, ipo"):
        preference_loss(z, z, z, z, beta=0.1, variant="kto")
    with pytest.raises(ValueError, match="beta must be > 0"):
        preference_loss(z, z, z, z, beta=0.0)


def test_config_accepts_dpo_and_needs_a_reference():
    cfg = TrainerConfig.model_validate({"loss": {"name": "dpo"}, "dpo": {"beta": 0.2}})
    assert cfg.needs_ref and not cfg.kl.enabled  # DPO's reference, no KL term
    assert not TrainerConfig().needs_ref
    with pytest.raises(ValueError, match="from_groups=false needs a pairs file"):
        TrainerConfig.model_validate({"loss": {"name": "dpo"}, "dpo": {"from_groups": False}})
    with pytest.raises(ValueError, match="greater than 0"):
        TrainerConfig.model_validate({"dpo": {"beta": 0}})
    with pytest.raises(ValueError, match=r"unknown policy loss 'dpp'.*dpo"):
        TrainerConfig.model_validate({"loss": {"name": "dpp"}})
