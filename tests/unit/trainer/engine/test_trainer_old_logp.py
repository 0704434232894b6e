"""Decoupled π_old from the update's own forward when the update is one pass (no pre-pass)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.engine.update import old_logp_in_update
from tests.helpers.trainer import assert_same_update, random_batch, tiny_lm

torch.set_num_threads(2)


def _trainer(old_logp: str, **over: Any) -> tuple[Trainer, list[int]]:
    """A trainer whose policy forwards are counted (pre-pass and update alike), and whose
    pre-pass records in ``t.need_old`` whether it computed π_old."""
    correction = {"old_logp": old_logp, **over.pop("correction", {})}
    cfg = TrainerConfig.model_validate({"optim": {"lr": 1e-2}, "correction": correction, **over})
    t = Trainer(cfg, tiny_lm())
    calls: list[int] = []
    forward = t.forward

    def counted(module: torch.nn.Module, *a: Any, **k: Any) -> Any:
        if module is t.policy:
            calls.append(1)
        return forward(module, *a, **k)

    t.forward = counted  # type: ignore[method-assign]
    prepass, t.need_old = t.prepass, []  # type: ignore[attr-defined]

    def recorded(batch: Any, need_old: bool) -> Any:
        t.need_old.append(need_old)  # type: ignore[attr-defined]
        return prepass(batch, need_old=need_old)

    t.prepass = recorded  # type: ignore[method-assign]
    return t, calls


@pytest.mark.parametrize(
    "over",
    [
        {},
        # Stale rollout logprobs (≈ -4.5 against the model's ≈ -4.85): weights ≠ 1, some capped.
        {"correction": {"is_level": "token", "is_cap": 0.8}},
        {"correction": {"is_level": "sequence", "is_cap": 1.5}},
        {"kl": {"coef": 0.1, "placement": "loss", "estimator": "k3"}},
    ],
    ids=["plain", "token-tis", "sequence-tis", "kl-in-loss"],
)
def test_one_pass_update_gives_the_pre_pass_update_with_one_forward_less(over: dict) -> None:
    trajs = random_batch(8)
    ref, ref_calls = _trainer("prepass", **over)
    alt, alt_calls = _trainer("auto", **over)
    assert not old_logp_in_update(ref) and old_logp_in_update(alt)
    m_ref, m_alt = assert_same_update(ref, alt, trajs)
    assert len(ref_calls) == 2 * len(alt_calls) > 0  # pre-pass + update against update alone
    assert (ref.need_old, alt.need_old) == ([True], [False])  # type: ignore[attr-defined]
    # The step's numbers about π_old are the pre-pass's, computed after the update instead.
    keys = [k for k in m_ref if k.startswith(("offpolicy/", "correction/", "kl/ref_kl_old"))]
    keys += ["loss/policy", "actor/ratio_mean"]
    assert "offpolicy/rho_mean" in keys
    if "is_level" in over.get("correction", {}):
        assert m_ref["correction/is_weight_mean"] < 0.99  # the weights are not all 1
    if "kl" in over:
        assert "kl/ref_kl_old" in keys
    for k in keys:
        assert m_alt[k] == pytest.approx(m_ref[k], rel=1e-5, abs=1e-7), k
    assert m_alt["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # π_θ / sg(π_θ)


@pytest.mark.parametrize(
    "over",
    [
        {"update": {"epochs": 2}},
        {"update": {"mini_batches": 2}},
        {"kl": {"coef": 0.1, "placement": "reward"}},
        {"correction": {"mask_level": "token"}},
        {"correction": {"veto_threshold": 1e-4}},
        {"correction": {"is_level": "token", "batch_normalize": True}},
        {"correction": {"mode": "bypass"}},
        {"advantage": {"estimator": "gae"}, "critic": {"kind": "value_head"}},
    ],
    ids=lambda o: next(iter(o)) + ":" + str(next(iter(next(iter(o.values())).items()))[0]),
)
def test_pi_old_is_recomputed_when_something_needs_it_before_the_update(over: dict) -> None:
    t, _ = _trainer("auto", **over)
    assert not old_logp_in_update(t)
    t.step(random_batch(8))
    bypass = over.get("correction", {}).get("mode") == "bypass"  # π_old = μ: no π_old pass
    assert t.need_old == [not bypass]  # type: ignore[attr-defined]


def test_dropout_keeps_the_pre_pass() -> None:
    t, _ = _trainer("auto")
    assert old_logp_in_update(t)
    lm: Any = t.policy.lm
    lm.config.attention_dropout = 0.1  # train-mode π_θ would be stochastic
    assert not old_logp_in_update(t)
