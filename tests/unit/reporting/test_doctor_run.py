"""The run doctor on synthetic metric streams: one per red flag, and a healthy run."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agentrl.reporting.doctor import FAILURE_MODES, RULES, LiveDoctor, diagnose, read_metrics
from agentrl.reporting.run_dir import RunDir

STEPS = 40
BREAK = 20  # the step where each failure begins


def healthy(step: int) -> dict[str, Any]:
    """A run that learns: reward 0.2 → 0.6, KL 0.01 → 0.05, entropy 1.5 → 1.0, small noise."""
    w = math.sin(step)  # deterministic wiggle
    return {
        "reward/mean": 0.2 + 0.01 * step + 0.01 * w,
        "reward/zero_std_group_frac": 0.25 + 0.05 * w,
        "kl/ref_kl": 0.01 + 0.001 * step,
        "actor/entropy": 1.5 - 0.0125 * step + 0.02 * w,
        "actor/clip_low_frac": 0.02,
        "actor/clip_high_frac": 0.03 + 0.01 * w,
        "response/truncated_frac": 0.05,
        "actor/grad_norm": 1.0 + 0.2 * w,
        "actor/grad_norm_max": 1.3 + 0.2 * w,
        "loss/value": 0.5 - 0.005 * step,
        "offpolicy/rho_mean": 1.0 + 0.01 * w,
        # 8 episodes a step, one of them broken now and then (not all: no flag).
        "episodes/generated": 8.0,
        "episodes/discarded": float(step % 3 == 0),
        "discard/episode:env_error": float(step % 3 == 0),
    }


def stream(broken: dict[str, Any] | None = None, evals: list[float] | None = None) -> list[dict]:
    """Rows as RunDir.log writes them; ``broken`` overrides metrics from step BREAK on."""
    rows: list[dict[str, Any]] = []
    succ = evals or [0.2, 0.3, 0.4, 0.45, 0.5]
    for step in range(STEPS + 1):
        if step % 10 == 0:
            rows.append({"step": step, "kind": "eval", "success": succ[step // 10]})
        if step == 0:
            continue
        m = healthy(step)
        if broken and step >= BREAK:
            m.update({k: (v(step) if callable(v) else v) for k, v in broken.items()})
        rows.append({"step": step, "kind": "train", "time": 0.0, **m})
    return rows


def test_healthy_run_has_no_flag() -> None:
    assert diagnose(stream()) == []


CASES = {
    # rule: (overrides from step 20, begin step derived by hand)
    "reward_flat_zero": ({"reward/mean": 0.0}, BREAK),
    # one-step rise 0.4 + 0.01·step vs median step change ≈ 0.01 → at step 20.
    "reward_spike": ({"reward/mean": lambda s: 0.6 + 0.01 * s}, BREAK),
    "zero_std_groups": ({"reward/zero_std_group_frac": 1.0}, BREAK),
    "kl_low": ({"kl/ref_kl": 0.001}, BREAK),
    "kl_high": ({"kl/ref_kl": 3.0}, BREAK),
    "entropy_plummet": ({"actor/entropy": 0.02}, BREAK),
    "clip_ratio_high": ({"actor/clip_high_frac": 0.35}, BREAK),
    "length_pegged": ({"response/truncated_frac": 0.9}, BREAK),
    # one spike: max grad norm 50 ≫ 10 × median ≈ 1.3.
    "grad_norm_spike": ({"actor/grad_norm_max": lambda s: 50.0 if s == BREAK else 1.3}, BREAK),
    # start median ≈ 0.485 (steps 1-5) → 10 > 4.85.
    "value_loss_diverging": ({"loss/value": lambda s: 10.0 * (s - 18)}, BREAK),
    "is_ratio_far_from_1": ({"offpolicy/rho_mean": 1.6}, BREAK),
    # every one of the 8 episodes discarded, from step 20 on (one such step is enough).
    "all_discarded": (
        {
            "episodes/discarded": 8.0,
            "discard/episode:agent_error": 8.0,
            "discard/episode:env_error": 0.0,
        },
        BREAK,
    ),
}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_each_failure_stream_raises_its_flag_at_its_step(rule: str) -> None:
    broken, begin = CASES[rule]
    flags = diagnose(stream(broken))
    assert [(f.name, f.step) for f in flags] == [(rule, begin)]
    assert flags[0].failure_mode in FAILURE_MODES and flags[0].levers


def test_reward_rising_while_heldout_success_is_flat() -> None:
    # Reward 0.2 + 0.01·step + 0.03·(step - 1) from the start; success stuck at 0.3.
    # Mean of steps 1-5 ≈ 0.32; before the eval at step 10 (steps 6-10): ≈ 0.52 → +0.2 > 0.1
    # already, and success 0.3 ≤ 0.3 → the flag begins at the eval of step 10.
    rows = stream(evals=[0.3, 0.3, 0.3, 0.28, 0.3])
    for r in rows:
        if r["kind"] == "train":
            r["reward/mean"] += 0.03 * (r["step"] - 1)
    flags = diagnose(rows)
    assert [(f.name, f.step) for f in flags] == [("reward_up_heldout_flat", 10)]
    assert flags[0].failure_mode == "reward_hacking"


def test_every_rule_has_a_stream() -> None:
    assert {r.name for r in RULES} == set(CASES) | {"reward_up_heldout_flat"}


def test_reads_what_a_run_writes(tmp_path) -> None:
    # Through RunDir.log (nulls for non-finite values, eval rows with kind "eval").
    run = RunDir(tmp_path)
    for r in stream({"kl/ref_kl": 3.0, "critic/explained_variance": float("nan")}):
        run.log(r["step"], {k: v for k, v in r.items() if k not in ("step", "kind", "time")},
                kind=r["kind"])  # fmt: skip
    flags = diagnose(read_metrics(tmp_path))
    assert [(f.name, f.step) for f in flags] == [("kl_high", BREAK)]
    with pytest.raises(FileNotFoundError, match=r"metrics\.jsonl"):
        read_metrics(tmp_path / "nope")


def test_live_doctor_reports_each_flag_once() -> None:
    doc = LiveDoctor()
    said: list[tuple[int, str]] = []
    for r in stream({"kl/ref_kl": 3.0}):
        m = {k: v for k, v in r.items() if k not in ("step", "kind", "time")}
        feed = doc.eval if r["kind"] == "eval" else doc.step
        said += [(r["step"], f.name) for f in feed(r["step"], m)]
    # KL > 2 for 2 steps: visible at step 21, begins at 20; printed once.
    assert said == [(21, "kl_high")]


def test_the_dashboard_reads_keys_the_trainer_writes() -> None:
    # Every key a rule reads is written by a real Trainer step (tiny model, GAE critic and a
    # reference model so value loss and KL exist): a renamed metric would blind the doctor.
    from agentrl.trainer import Trainer, TrainerConfig
    from tests.helpers.trainer import random_batch, tiny_lm

    cfg = TrainerConfig(advantage={"estimator": "gae"}, kl={"coef": 0.1})
    m = Trainer(cfg, tiny_lm()).step(random_batch(4, group_size=2))
    read = [
        "reward/mean", "reward/zero_std_group_frac", "kl/ref_kl", "actor/entropy",
        "actor/clip_low_frac", "actor/clip_high_frac", "response/truncated_frac",
        "actor/grad_norm_max", "loss/value", "offpolicy/rho_mean",
    ]  # fmt: skip
    assert [k for k in read if k not in m] == []


def test_rules_without_their_metric_are_reported_unchecked() -> None:
    from agentrl.reporting.doctor import unchecked

    rows = stream()
    assert unchecked(rows) == []
    no_ref = [{k: v for k, v in r.items() if k != "kl/ref_kl"} for r in rows]  # kl.coef = 0
    assert unchecked(no_ref) == ["kl_low", "kl_high"]


LONG = 400
LONG_BREAK = 300


def long_stream(broken: dict[str, Any]) -> list[dict[str, Any]]:
    """A healthy 40-step cycle repeated for LONG steps, an eval every 10; ``broken`` (as in
    CASES, read at the step it would have in :func:`stream`) from LONG_BREAK on."""
    rows: list[dict[str, Any]] = []
    for step in range(1, LONG + 1):
        if step % 10 == 0:
            rows.append({"step": step, "kind": "eval", "success": 0.2 + 0.5 * step / LONG})
        m = healthy((step - 1) % 40 + 1)
        if step >= LONG_BREAK:
            s = step - LONG_BREAK + BREAK
            m.update({k: (v(s) if callable(v) else v) for k, v in broken.items()})
        rows.append({"step": step, "kind": "train", **m})
    return rows


@pytest.mark.parametrize("rule", sorted(CASES))
def test_the_live_doctor_keeps_few_rows_and_still_flags_late_in_a_long_run(rule: str) -> None:
    assert diagnose(long_stream({})) == []
    broken, begin = CASES[rule]
    rows = long_stream(broken)
    doc = LiveDoctor(tail=64)
    said: list[tuple[str, int]] = []
    for r in rows:
        m = {k: v for k, v in r.items() if k not in ("step", "kind")}
        said += [(f.name, f.step) for f in (doc.eval if r["kind"] == "eval" else doc.step)(
            r["step"], m)]  # fmt: skip
        assert len(doc.rows) <= 2 * (doc.head + 64)
    at = LONG_BREAK + begin - BREAK
    assert said == [(rule, at)]
    # The whole file, read after the fact, dates it the same.
    assert [(f.name, f.step) for f in diagnose(rows)] == [(rule, at)]
