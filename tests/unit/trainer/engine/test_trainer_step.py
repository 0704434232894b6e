"""Trainer.step end to end on a tiny random Qwen2: learning direction, invariances, errors."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer import NonFiniteError, Trainer, TrainerConfig
from agentrl.trainer.engine.batch import build_batch
from tests.helpers.trainer import (
    assert_same_update,
    episode,
    params,
    random_batch,
    tiny_lm,
)

torch.set_num_threads(2)


def _adv_weighted_logp(t: Trainer, trajs, adv: list[float]) -> float:
    # Σ_i A_i · Σ_t log π(y_i,t): what the policy gradient increases.
    b = build_batch(trajs, [0.0] * len(trajs), [False] * len(trajs))
    with torch.no_grad():
        out = t.forward(t.policy, b, list(range(len(trajs))))
    return float(sum(a * float(out.logp_bR[i].sum()) for i, a in enumerate(adv)))


def test_smoke_advantage_weighted_logprob_moves_up() -> None:
    # One group, rewards 1, 0, 1, 0 → GRPO advantages ±0.866 (mean 0.5, unbiased std 0.57735).
    trajs = [
        episode(0, "g", [1, 2, 3], [10, 11, 12], 1.0),
        episode(1, "g", [1, 2, 3], [20, 21], 0.0),
        episode(2, "g", [1, 2, 3], [10, 30], 1.0),
        episode(3, "g", [1, 2, 3], [40, 41, 42, 43], 0.0),
    ]
    t = Trainer(TrainerConfig(optim={"lr": 3e-3}, correction={"mode": "bypass"}), tiny_lm())
    adv = [1.0, -1.0, 1.0, -1.0]
    before = _adv_weighted_logp(t, trajs, adv)
    for _ in range(5):
        m = t.step(trajs)
    after = _adv_weighted_logp(t, trajs, adv)
    assert after > before + 1.0, (before, after)
    assert m["adv/max"] == pytest.approx(0.866, abs=1e-3)
    assert m["step"] == 5.0


@pytest.mark.parametrize(
    "update",
    [
        {"token_budget": 12, "packing": True},
        {"token_budget": 12, "packing": False},
        {"strategy": "fixed", "micro_batch_size": 1},
    ],
)
def test_micro_batching_does_not_change_the_update(update: dict) -> None:
    trajs = random_batch(8)
    base = {"mini_batches": 2, "epochs": 2}
    ref = Trainer(
        TrainerConfig(optim={"lr": 1e-3}, update={**base, "token_budget": 10_000}), tiny_lm()
    )
    alt = Trainer(TrainerConfig(optim={"lr": 1e-3}, update={**base, **update}), tiny_lm())
    assert_same_update(ref, alt, trajs)


def test_non_finite_loss_stops_the_step_and_keeps_weights() -> None:
    trajs = random_batch(4)
    trajs[2].reward = math.nan
    t = Trainer(TrainerConfig(advantage={"estimator": "rloo"}), tiny_lm())
    before = params(t)
    with pytest.raises(NonFiniteError, match=r"loss/policy is nan .*mini-batch 0.*ep"):
        t.step(trajs)
    after = params(t)
    for k in before:
        assert torch.equal(before[k], after[k])


def test_bad_trajectory_is_named() -> None:
    trajs = random_batch(2)
    trajs[1].loss_mask = trajs[1].loss_mask[:-1]
    t = Trainer(TrainerConfig(), tiny_lm())
    with pytest.raises(ValueError, match=r"trajectory ep1 .*loss_mask has"):
        t.step(trajs)


def test_config_errors_list_valid_names() -> None:
    with pytest.raises(ValueError, match="valid: dr_grpo, gae, grpo"):
        TrainerConfig(advantage={"estimator": "grpoo"})
    with pytest.raises(ValueError, match="valid: dual_clip, gspo, pg, ppo"):
        TrainerConfig(loss={"name": "clip"})
    with pytest.raises(ValueError, match="on-policy"):
        TrainerConfig(loss={"name": "pg"}, update={"epochs": 2})
    with pytest.raises(ValueError, match="extra"):
        TrainerConfig(optim={"learning_rate": 1.0})


@pytest.mark.parametrize("kind", ["value_head", "separate"])
def test_gae_with_critic_learns_values(kind: str) -> None:
    trajs = random_batch(4)
    cfg = TrainerConfig(
        advantage={"estimator": "gae", "gamma": 1.0, "lam": 0.95},
        critic={"kind": kind, "lr": 1e-2},
        optim={"lr": 1e-3},
    )
    t = Trainer(cfg, tiny_lm())
    first = t.step(trajs)
    for _ in range(4):
        last = t.step(trajs)
    assert last["loss/value"] < first["loss/value"]
    assert "critic/explained_variance" in last and "critic/value_clip_frac" in last
    if kind == "separate":
        assert "critic/grad_norm" in last


def test_kl_in_loss_reference_and_reference_free() -> None:
    trajs = random_batch(4)
    free = Trainer(TrainerConfig(), tiny_lm())
    assert free.ref is None
    t = Trainer(TrainerConfig(kl={"coef": 0.1, "placement": "loss", "estimator": "k3"}), tiny_lm())
    assert t.ref is not None
    m = t.step(trajs)
    assert m["kl/ref_kl"] == pytest.approx(0.0, abs=1e-7)  # π_θ = π_ref before the first update
    m = t.step(trajs)
    assert m["kl/ref_kl"] > 0.0


def test_adaptive_kl_in_reward() -> None:
    trajs = random_batch(4)
    cfg = TrainerConfig(
        kl={"coef": 0.05, "placement": "reward", "adaptive": True, "target": 1.0, "horizon": 8},
        optim={"lr": 1e-2},
    )
    t = Trainer(cfg, tiny_lm())
    t.step(trajs)
    m = t.step(trajs)
    # KL ≪ target → e = -0.2 each step: β = 0.05·(1 - 0.2·4/8) = 0.045, then 0.0405.
    assert m["kl/coef"] == pytest.approx(0.0405, rel=1e-6)


def test_bypass_correction_metrics_and_staleness() -> None:
    trajs = random_batch(4)
    for i, t in enumerate(trajs):
        t.weight_versions = [v if v < 0 else 3 + (i % 2) * 2 for v in t.weight_versions]
    cfg = TrainerConfig(
        loss={"name": "pg"},
        correction={"mode": "bypass", "is_level": "token", "mask_level": "token"},
    )
    m = Trainer(cfg, tiny_lm()).step(trajs, weight_version=6)
    # Rollout logprobs are ≈ -4.5 while the random model gives ≈ -ln(128) = -4.85: ρ < 1 but inside
    # ICEPOP's [0.5, 5] on most tokens.
    assert 0.0 < m["offpolicy/rho_mean"] < 2.0
    assert 0.0 <= m["correction/masked_token_frac"] <= 1.0
    # Versions 3 and 5 against 6: lags 3 and 1.
    assert (m["staleness/max"], m["staleness/min"]) == (3.0, 1.0)


def test_dynamic_filter_counts_and_skips() -> None:
    trajs = [episode(i, "g", [1, 2], [3, 4], 1.0) for i in range(4)]
    t = Trainer(TrainerConfig(shaping={"dynamic_filter": True}), tiny_lm())
    m = t.step(trajs)
    assert m["step/skipped"] == 1.0 and m["filter/dropped_groups"] == 1.0
    m = t.step(trajs)
    assert m["filter/dropped_groups_total"] == 2.0


def test_dashboard_metrics_present() -> None:
    m = Trainer(TrainerConfig(loss={"name": "dual_clip"}), tiny_lm()).step(random_batch(8))
    for key in (
        "reward/mean", "reward/std", "reward/zero_std_group_frac", "actor/entropy",
        "actor/clip_low_frac", "actor/clip_high_frac", "actor/dual_clip_frac",
        "response/length_mean", "response/length_max", "response/truncated_frac",
        "actor/grad_norm", "actor/ratio_min", "actor/ratio_mean", "actor/ratio_max",
        "offpolicy/kl_k1", "offpolicy/chi2_token", "offpolicy/ppl_ratio",
        "perf/tokens_per_s", "time/prepass", "time/update", "optim/lr",
    ):  # fmt: skip
        assert key in m and math.isfinite(m[key]), key


def test_trainer_does_not_import_rollout_inference_or_orchestration() -> None:
    import subprocess
    import sys

    # Beyond what ``import agentrl`` itself loads (the public API's LLMClient protocol).
    code = (
        "import sys, agentrl\n"
        "base = set(sys.modules)\n"
        "import agentrl.trainer\n"
        "bad = [m for m in set(sys.modules) - base if m.split('.')[1:2] in "
        "(['rollout'], ['inference'], ['orchestration']) and m.startswith('agentrl.')]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_episodes_without_model_tokens_are_counted_and_skipped() -> None:
    # A prompt that filled the context: no sampled token, nothing to train on.
    empty = [episode(i, "g", [1, 2, 3], [], float(i)) for i in range(2)]
    t = Trainer(TrainerConfig(), tiny_lm())
    before = params(t)
    m = t.step(empty)
    assert m["step/skipped"] == 1.0 and m["batch/episodes_without_model_tokens"] == 2.0
    assert all(torch.equal(before[k], v) for k, v in params(t).items())
    # Mixed with trainable episodes, they are left out of the update and counted.
    m = t.step([*empty, *random_batch(4)])
    assert "step/skipped" not in m and m["batch/episodes_without_model_tokens"] == 2.0


@pytest.mark.parametrize(("supervision", "process"), [("auto", False), ("process", True)])
def test_supervision_and_in_reward_kl_reach_the_estimator(
    supervision: str, process: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue #43: grpo's supervision comes from the config (auto unresolved: outcome), and
    # the in-reward KL penalty reaches the estimator apart from the episodes' rewards.
    import agentrl.trainer.engine.trainer as trainer_mod

    seen = []
    real = trainer_mod.compute_advantages

    def spy(name, inputs, whiten=None):
        seen.append(inputs)
        return real(name, inputs, whiten)

    monkeypatch.setattr(trainer_mod, "compute_advantages", spy)
    cfg = TrainerConfig(
        advantage={"supervision": supervision},
        kl={"coef": 0.05, "placement": "reward"},
        optim={"lr": 1e-2},
    )
    trajs = random_batch(4)
    t = Trainer(cfg, tiny_lm())
    t.step(trajs)  # the policy moves away from the reference: KL > 0 on the next step
    t.step(trajs)
    x = seen[-1]
    assert x.process is process
    assert x.penalty_BR is not None and float(x.penalty_BR.abs().sum()) > 0
    want = build_batch(trajs, [t.reward for t in trajs], [False] * 4).rewards_BR
    torch.testing.assert_close(x.rewards_BR, want)
