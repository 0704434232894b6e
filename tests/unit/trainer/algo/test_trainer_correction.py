"""Rollout correction (TIS / ICEPOP / rejection / veto) and off-policy diagnostics by hand."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer.algo.correction import compute_correction, offpolicy_diagnostics

# ρ = π_old/μ per token. Row 0: [0.4, 1.0, 3.0]; row 1: [2.0, 6.0, (padding)].
RHO = [[0.4, 1.0, 3.0], [2.0, 6.0, 1.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
MU = torch.full((2, 3), -3.0)
OLD = MU + torch.log(torch.tensor(RHO))


def corr(**kw):
    return compute_correction(OLD, MU, MASK, **kw)


def test_no_correction_is_identity() -> None:
    c = corr()
    assert torch.equal(c.weights_BR, MASK)
    assert torch.equal(c.keep_BR, MASK)


def test_token_tis() -> None:
    # w = min(ρ, 2) → [0.4, 1, 2], [2, 2, 0 (padding)]
    c = corr(is_level="token", is_cap=2.0)
    torch.testing.assert_close(c.weights_BR, torch.tensor([[0.4, 1.0, 2.0], [2.0, 2.0, 0.0]]))


def test_sequence_and_geometric_tis() -> None:
    # Π ρ: row 0 = 0.4·1·3 = 1.2; row 1 = 12 → min(·, 2) = 2.
    c = corr(is_level="sequence", is_cap=2.0)
    torch.testing.assert_close(c.weights_BR, torch.tensor([[1.2, 1.2, 1.2], [2.0, 2.0, 0.0]]))
    # Geometric mean: row 0 = 1.2^(1/3) = 1.062659; row 1 = sqrt(12) = 3.4641 → 2.
    g = 1.2 ** (1 / 3)
    c = corr(is_level="geometric", is_cap=2.0)
    torch.testing.assert_close(c.weights_BR, torch.tensor([[g, g, g], [2.0, 2.0, 0.0]]))


def test_icepop_token_mask() -> None:
    # Keep ρ ∈ [0.5, 5]: row 0 drops 0.4, row 1 drops 6.0.
    c = corr(mask_level="token", mask_low=0.5, mask_high=5.0)
    torch.testing.assert_close(c.keep_BR, torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))
    assert c.metrics["masked_tokens"] == 2.0


def test_sequence_and_geometric_rejection() -> None:
    # Sequence ratio 1.2 ∈ [0.5, 5] kept; 12 ∉ → row 1 rejected.
    c = corr(mask_level="sequence", mask_low=0.5, mask_high=5.0)
    torch.testing.assert_close(c.keep_BR, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert c.metrics["rejected_seqs"] == 1.0
    # Geometric 3.4641 ∈ [0.5, 5] → both kept.
    c = corr(mask_level="geometric", mask_low=0.5, mask_high=5.0)
    torch.testing.assert_close(c.keep_BR, MASK)


def test_seq_mask_tis_combination() -> None:
    # seq-mask-TIS: sequence rejection + token TIS: row 0 keeps w = [0.4, 1, 2]; row 1 rejected.
    c = corr(mask_level="sequence", mask_low=0.5, mask_high=5.0, is_level="token", is_cap=2.0)
    torch.testing.assert_close(
        (c.weights_BR * c.keep_BR), torch.tensor([[0.4, 1.0, 2.0], [0.0, 0.0, 0.0]])
    )


def test_veto_catastrophic_token() -> None:
    # Threshold 0.5: row 0 has ρ = 0.4 < 0.5 → the whole episode is vetoed.
    c = corr(veto_threshold=0.5)
    torch.testing.assert_close(c.keep_BR, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    assert c.metrics["veto_seqs"] == 1.0


def test_batch_normalized_weights() -> None:
    # Token TIS weights [0.4, 1, 2, 2, 2]: mean 7.4/5 = 1.48 → each / 1.48.
    c = corr(is_level="token", is_cap=2.0, batch_normalize=True)
    exp = torch.tensor([[0.4, 1.0, 2.0], [2.0, 2.0, 0.0]]) / 1.48
    torch.testing.assert_close(c.weights_BR, exp)
    assert float(c.weights_BR[MASK > 0].mean()) == pytest.approx(1.0)


def test_offpolicy_diagnostics_by_hand() -> None:
    d = offpolicy_diagnostics(OLD, MU, MASK)
    logs = [math.log(x) for x in (0.4, 1.0, 3.0, 2.0, 6.0)]
    # k1 = mean(log μ - log π) = -mean(log ρ) = -(−0.91629 + 0 + 1.09861 + 0.69315 + 1.79176)/5
    assert d["kl_k1"] == pytest.approx(-sum(logs) / 5, abs=1e-5)
    # k3 = mean(ρ - 1 - log ρ)
    assert d["kl_k3"] == pytest.approx(sum(math.exp(x) - 1 - x for x in logs) / 5, abs=1e-5)
    # χ² = mean(ρ²) - 1 = (0.16 + 1 + 9 + 4 + 36)/5 - 1 = 9.032;
    # per sequence: (1.2² + 12²)/2 - 1 = (1.44 + 144)/2 - 1 = 71.72
    assert d["chi2_token"] == pytest.approx(9.032, abs=1e-4)
    assert d["chi2_seq"] == pytest.approx(71.72, abs=1e-3)
    # PPL_π/PPL_μ per episode = exp(-mean log ρ): 1.2^(-1/3) = 0.941036, 12^(-1/2) = 0.288675
    assert d["ppl_ratio"] == pytest.approx((0.941036 + 0.288675) / 2, abs=1e-5)
    assert (d["rho_min"], d["rho_max"]) == pytest.approx((0.4, 6.0))
    assert d["rho_mean"] == pytest.approx(12.4 / 5)
    # |log π - log μ| = |log ρ|: mean (0.91629 + 0 + 1.09861 + 0.69315 + 1.79176)/5, max log 6
    assert d["logp_absdiff_mean"] == pytest.approx(sum(abs(x) for x in logs) / 5, abs=1e-5)
    assert d["logp_absdiff_max"] == pytest.approx(math.log(6.0), abs=1e-5)


def test_identical_policies_have_no_mismatch() -> None:
    d = offpolicy_diagnostics(MU, MU, MASK)
    assert d["kl_k1"] == 0.0 and d["kl_k3"] == 0.0 and d["chi2_token"] == pytest.approx(0.0)
    assert d["ppl_ratio"] == pytest.approx(1.0)
    assert d["logp_absdiff_mean"] == 0.0 and d["logp_absdiff_max"] == 0.0


# ----------------------------------------------------------------- issue #13 defects 5, 6


def test_veto_below_the_log_ratio_clamp_fires() -> None:
    # Defect 5: ρ = e^-30 = 9.4e-14 on one token; threshold 1e-10. The veto compared the ratio
    # clamped at e^-20 = 2.06e-9 > 1e-10, so it never fired; it compares log ρ now.
    mu = torch.zeros(2, 2)
    old = torch.tensor([[-30.0, 0.0], [0.0, 0.0]])
    c = compute_correction(old, mu, torch.ones(2, 2), veto_threshold=1e-10)
    assert c.metrics["veto_seqs"] == 1.0
    torch.testing.assert_close(c.keep_BR, torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    # A token mask with a bound below e^-20 works the same way.
    c = compute_correction(old, mu, torch.ones(2, 2), mask_level="token", mask_low=1e-10)
    torch.testing.assert_close(c.keep_BR, torch.tensor([[0.0, 1.0], [1.0, 1.0]]))


def test_batch_normalization_averages_over_kept_tokens() -> None:
    # Defect 6 (chosen and documented): ICEPOP [0.5, 5] drops ρ = 0.4 and 6; kept ρ = 1, 3, 2
    # → TIS (C = 2) 1, 2, 2, mean over the kept tokens 5/3 → 0.6, 1.2, 1.2 (mean 1 in the loss).
    # verl divides by the mean over all response tokens (7.4/5 = 1.48: 0.676, 1.351, 1.351).
    c = corr(is_level="token", is_cap=2.0, mask_level="token", batch_normalize=True)
    kept = (c.weights_BR * c.keep_BR)[c.keep_BR > 0]
    assert kept.tolist() == pytest.approx([0.6, 1.2, 1.2], abs=1e-6)
