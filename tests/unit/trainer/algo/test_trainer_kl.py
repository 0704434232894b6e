"""KL estimators in float32 near π = π_ref (issue #13 defect 3)."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.algo.kl import kl_estimate


def test_k3_is_accurate_and_non_negative_in_float32_near_equal_policies() -> None:
    # k3 = e^x - 1 - x with x = log(π_ref/π); for small x the Taylor series gives
    # x²/2 + x³/6 + x⁴/24: x = 1e-4 → 5.00017e-9, x = -3e-4 → 4.49955e-8. exp(x) - 1 in float32
    # cancels to a multiple of 2^-23 (1.2e-7) and gave -6e-8 or 0 here; expm1 does not cancel.
    x = torch.tensor([1e-4, -1e-4, -3e-4, 2e-3])
    want = [v**2 / 2 + v**3 / 6 + v**4 / 24 for v in x.double().tolist()]
    got = kl_estimate(torch.zeros(4), x, "k3")
    assert got.dtype == torch.float32
    assert got.tolist() == pytest.approx(want, rel=1e-3)


def test_k3_never_negative_on_many_tokens() -> None:
    # The review's case: 200,000 float32 tokens with π_ref ≈ π (|log r| ~ 1e-4): min was -6e-8.
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(200_000, generator=g) * 5
    ref = logp + torch.randn(200_000, generator=g) * 1e-4
    k3 = kl_estimate(logp, ref, "k3")
    assert float(k3.min()) >= 0.0
    exact = torch.expm1((ref - logp).double()) - (ref - logp).double()
    assert float((k3.double() - exact).abs().max()) < 1e-9
