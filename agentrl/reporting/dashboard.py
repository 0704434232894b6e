"""The minimum dashboard's red-flag rules: which signal, when it is red, what it means.

Each rule reads the rows of metrics.jsonl (the keys the trainer and driver write:
``reward/mean``, ``reward/zero_std_group_frac``, ``kl/ref_kl``, ``actor/entropy``,
``actor/clip_low_frac`` + ``actor/clip_high_frac``, ``response/truncated_frac``,
``actor/grad_norm_max``, ``loss/value``, ``offpolicy/rho_mean``, ``episodes/generated``
with ``episodes/discarded``, and the eval rows' ``success``) and returns the step at
which its condition began. Thresholds are the
runbook's: KL < 0.005 or > 2, clip fraction > 0.3 sustained, > 80% truncated, etc.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.reporting.discards import all_discarded, describe_counts, discard_counts

__all__ = ["FAILURE_MODES", "RULES", "Flag", "Rule", "finite_number", "series", "sustained"]

FAILURE_MODES: dict[str, str] = {
    "no_signal": "no learning signal: advantages are (almost) all zero, nothing moves",
    "reward_hacking": "reward hacking: the reward rises without the task being solved",
    "entropy_collapse": "entropy collapse: the policy turns deterministic and stops exploring",
    "instability": "instability: updates too large, the policy or critic drifts or diverges",
    "mismatch": "train/inference mismatch: the sampler and the trainer disagree (off-policy)",
    "length_runaway": "length runaway: responses run into the token cap and get truncated",
    "broken_episodes": "broken episodes: every episode fails (agent, env, inference server, "
    "chat template or reward model) and is discarded, so nothing is trained",
}
"""The failure modes a flag can point to (name → what goes wrong)."""

Series = list[tuple[int, float]]


@dataclass(frozen=True)
class Flag:
    """One red flag.

    Attributes:
        name: The rule that fired.
        step: The training step at which the condition began.
        failure_mode: A key of :data:`FAILURE_MODES`.
        detail: What was seen (metric and values).
        levers: What to change, config keys first.
    """

    name: str
    step: int
    failure_mode: str
    detail: str
    levers: tuple[str, ...]

    def render(self) -> str:
        """One paragraph for a terminal."""
        return (
            f"[red flag] step {self.step}: {self.name}: {self.detail}\n"
            f"  failure mode: {FAILURE_MODES[self.failure_mode]}\n"
            f"  levers: {'; '.join(self.levers)}"
        )


@dataclass(frozen=True)
class Rule:
    """A dashboard signal: ``check(train_rows, eval_rows) -> (begin step, detail) | None``.

    ``keys`` are the metrics it reads (any one present makes it checkable); ``baseline``
    is how many of the first rows of each kind it reads as a baseline (the rest of what
    it reads is the last few rows): a live check keeps those and a recent tail.
    """

    name: str
    failure_mode: str
    levers: tuple[str, ...]
    check: Callable[[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]], Any]
    keys: tuple[str, ...] = ()
    baseline: int = 0


def finite_number(v: Any) -> float | None:
    """``v`` as a float if it is a finite number (not a bool, None or NaN), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def series(rows: Sequence[Mapping[str, Any]], *keys: str) -> Series:
    """(step, value) of the first of ``keys`` present in each row, finite values only."""
    out: Series = []
    for r in rows:
        for k in keys:
            v = finite_number(r.get(k))
            if v is not None:
                out.append((int(r["step"]), v))
                break
    return out


def sustained(s: Series, bad: Callable[[float], bool], n: int) -> tuple[int, float] | None:
    """The first run of ``n`` consecutive bad values: (its first step, its last value)."""
    run_start, count = None, 0
    for step, v in s:
        if bad(v):
            run_start = step if count == 0 else run_start
            count += 1
            if count >= n:
                assert run_start is not None
                return run_start, v
        else:
            count = 0
    return None


# ------------------------------------------------------------------------ the rules


def _reward_flat_zero(train: Sequence[Mapping[str, Any]], _: Any) -> tuple[int, str] | None:
    hit = sustained(series(train, "reward/mean", "score/mean"), lambda v: abs(v) <= 1e-9, 5)
    return (hit[0], "reward/mean is 0 for 5+ consecutive steps") if hit else None


def _reward_spike(train: Sequence[Mapping[str, Any]], _: Any) -> tuple[int, str] | None:
    # A vertical jump: one step's rise > 0.3 and > 6× the median step change before it.
    s = series(train, "reward/mean", "score/mean")
    for i in range(6, len(s)):
        prior = [abs(s[j][1] - s[j - 1][1]) for j in range(max(1, i - 10), i)]
        jump = s[i][1] - s[i - 1][1]
        if jump > 0.3 and jump > 6 * statistics.median(prior):
            return s[i][0], f"reward/mean jumped {s[i - 1][1]:.3g} → {s[i][1]:.3g} in one step"
    return None


def _zero_std_groups(train: Sequence[Mapping[str, Any]], _: Any) -> tuple[int, str] | None:
    hit = sustained(series(train, "reward/zero_std_group_frac"), lambda v: v >= 0.9, 3)
    if hit is None:
        return None
    return hit[0], f"reward/zero_std_group_frac ≥ 0.9 for 3+ steps ({hit[1]:.2f})"


_KL_KEYS = ("kl/ref_kl", "kl/ref_kl_old")


def _kl_low(train: Sequence[Mapping[str, Any]], _: Any) -> tuple[int, str] | None:
    # The first steps sit at KL ≈ 0 by construction (π = π_ref): only after step 5.
    s = [(st, v) for st, v in series(train, *_KL_KEYS) if st > 5]
    hit = sustained(s, lambda v: v < 0.005, 10)
    return (hit[0], f"KL to the reference < 0.005 for 10+ steps ({hit[1]:.2g})") if hit else None


def _kl_high(train: Sequence[Mapping[str, Any]], _: Any) -> tuple[int, str] | None:
    hit = sustained(series(train, *_KL_KEYS), lambda v: v > 2.0, 2)
    return (hit[0], f"KL to the reference > 2 for 2+ steps ({hit[1]:.3g})") if hit else None


def _entropy_plummet(train: Sequence[Mapping[str, Any]], _: Any) -> tuple[int, str] | None:
    s = series(train, "actor/entropy", "entropy/old")
    if len(s) < 4:
        return None
    base = statistics.median(v for _, v in s[:3])
    hit = sustained(s[3:], lambda v: v < 0.05 or v < 0.1 * base, 3)
    if hit is None:
        return None
    return hit[0], f"actor/entropy fell to {hit[1]:.3g} (start {base:.3g}; < 0.05 or < 10%)"


def _clip_ratio(train: Sequence[Mapping[str, Any]], _: Any) -> tuple[int, str] | None:
    s: Series = []
    for r in train:
        lo, hi = (
            finite_number(r.get("actor/clip_low_frac")),
            finite_number(r.get("actor/clip_high_frac")),
        )
        if lo is not None or hi is not None:
            s.append((int(r["step"]), (lo or 0.0) + (hi or 0.0)))
    hit = sustained(s, lambda v: v > 0.3, 3)
    return (hit[0], f"clipped token fraction > 0.3 for 3+ steps ({hit[1]:.2f})") if hit else None


def _length_pegged(train: Sequence[Mapping[str, Any]], _: Any) -> tuple[int, str] | None:
    hit = sustained(series(train, "response/truncated_frac"), lambda v: v > 0.8, 2)
    if hit is None:
        return None
    return hit[0], f"response/truncated_frac > 0.8 for 2+ steps ({hit[1]:.2f})"


def _grad_spike(train: Sequence[Mapping[str, Any]], _: Any) -> tuple[int, str] | None:
    s = series(train, "actor/grad_norm_max", "actor/grad_norm")
    for i in range(5, len(s)):
        base = statistics.median(v for _, v in s[max(0, i - 10) : i])
        if s[i][1] > 10 * base and s[i][1] > 1e-6:
            return s[i][0], f"actor/grad_norm {s[i][1]:.3g} is > 10× the recent median {base:.3g}"
    return None


def _value_diverging(train: Sequence[Mapping[str, Any]], _: Any) -> tuple[int, str] | None:
    s = series(train, "loss/value")
    if len(s) < 6:
        return None
    base = statistics.median(v for _, v in s[:5])
    hit = sustained(s[5:], lambda v: v > 10 * max(base, 1e-8), 3)
    if hit is None:
        return None
    return hit[0], f"loss/value {hit[1]:.3g} stays > 10× its start {base:.3g}"


def _is_ratio(train: Sequence[Mapping[str, Any]], _: Any) -> tuple[int, str] | None:
    s = series(train, "offpolicy/rho_mean", "correction/is_weight_mean")
    hit = sustained(s, lambda v: not 0.8 <= v <= 1.25, 2)
    if hit is None:
        return None
    return hit[0], f"mean importance ratio π/μ = {hit[1]:.3g}, outside [0.8, 1.25] for 2+ steps"


def _all_discarded(train: Sequence[Mapping[str, Any]], _: Any) -> tuple[int, str] | None:
    # A step that generated episodes and discarded every one: it trained on nothing.
    hit = [r for r in train if all_discarded(r)]
    if not hit:
        return None
    first = hit[0]
    n = int(first["episodes/generated"])
    why = describe_counts(discard_counts(first)) or "no reason recorded"
    more = f"; {len(hit)} such steps, the last at step {hit[-1]['step']}" if len(hit) > 1 else ""
    return int(first["step"]), (
        f"every episode of the step was discarded ({n} of {n}: {why}){more}"
    )


def _measured(evals: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Evaluations with a measured success (not every episode discarded)."""
    out = []
    for r in evals:
        n, d = finite_number(r.get("episodes")), finite_number(r.get("discarded"))
        if n is None or d is None or not d >= n > 0:
            out.append(r)
    return out


def _reward_vs_heldout(
    train: Sequence[Mapping[str, Any]], evals: Sequence[Mapping[str, Any]]
) -> tuple[int, str] | None:
    # Training reward up by > 0.1 (last 5 steps before each eval vs the first 5 steps) while
    # held-out success has not improved since the first eval; flagged at the first such
    # eval if it still holds at the last one.
    r = series(train, "reward/mean", "score/mean")
    e = series(_measured(evals), "success")
    if len(r) < 10 or len(e) < 2:
        return None
    start = statistics.fmean(v for _, v in r[:5])

    def stalled(j: int) -> bool:
        upto = [v for st, v in r if st <= e[j][0]][-5:]
        return len(upto) == 5 and statistics.fmean(upto) - start > 0.1 and e[j][1] <= e[0][1]

    if not stalled(len(e) - 1):
        return None
    first = next(j for j in range(1, len(e)) if stalled(j))
    return e[first][0], (
        f"training reward rose from {start:.3g} while held-out success went "
        f"{e[0][1]:.3g} → {e[-1][1]:.3g}"
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "reward_flat_zero",
        "no_signal",
        (
            "check the scorer: `agentrl doctor reward --env ENV`",
            "easier tasks or a curriculum (task_kwargs)",
            "an SFT warm start",
            "more episodes per task (rollout.group_size)",
            "a higher rollout.temperature",
        ),
        _reward_flat_zero,
        ("reward/mean", "score/mean"),
    ),
    Rule(
        "reward_spike",
        "reward_hacking",
        (
            "read that step's episodes: `agentrl view RUN_DIR --step N`",
            "check the scorer: `agentrl doctor reward --env ENV`",
            "tighten the verifier (answer format, empty answers)",
            "a KL penalty (trainer.kl.coef)",
        ),
        _reward_spike,
        ("reward/mean", "score/mean"),
    ),
    Rule(
        "zero_std_groups",
        "no_signal",
        (
            "drop them and refill: orchestration.dynamic_filter=true with oversample > 1",
            "tasks of the right difficulty (neither all solved nor all failed)",
            "more episodes per task (rollout.group_size)",
            "a higher rollout.temperature",
        ),
        _zero_std_groups,
        ("reward/zero_std_group_frac",),
    ),
    Rule(
        "kl_low",
        "no_signal",
        (
            "a higher trainer.optim.lr",
            "check the advantages are not all zero (reward/zero_std_group_frac)",
            "more updates per batch (trainer.update.mini_batches / epochs)",
        ),
        _kl_low,
        _KL_KEYS,
    ),
    Rule(
        "kl_high",
        "instability",
        (
            "a lower trainer.optim.lr",
            "a larger trainer.kl.coef or trainer.kl.adaptive=true",
            "tighter clipping (trainer.loss.clip_low / clip_high)",
            "fewer updates per batch (trainer.update.epochs / mini_batches)",
        ),
        _kl_high,
        _KL_KEYS,
    ),
    Rule(
        "entropy_plummet",
        "entropy_collapse",
        (
            "clip-higher: trainer.loss.clip_high=0.28",
            "an entropy bonus (trainer.loss.entropy_coef)",
            "a higher rollout.temperature",
            "a lower trainer.optim.lr",
        ),
        _entropy_plummet,
        ("actor/entropy", "entropy/old"),
        baseline=3,
    ),
    Rule(
        "clip_ratio_high",
        "instability",
        (
            "a lower trainer.optim.lr",
            "fewer updates per batch (trainer.update.epochs / mini_batches)",
            "less staleness (orchestration.max_staleness, mode=sync)",
        ),
        _clip_ratio,
        ("actor/clip_low_frac", "actor/clip_high_frac"),
    ),
    Rule(
        "length_pegged",
        "length_runaway",
        (
            "the overlong penalty (trainer.shaping.overlong_buffer with max_response_tokens)",
            "the stop-properly penalty (trainer.shaping.stop_properly_coef)",
            "a larger rollout.max_tokens_per_turn / max_total_tokens",
            "check the stop tokens and chat template: `agentrl doctor tokenizer`",
        ),
        _length_pegged,
        ("response/truncated_frac",),
    ),
    Rule(
        "grad_norm_spike",
        "instability",
        (
            "clip the gradient norm (trainer.optim.max_grad_norm)",
            "a lower trainer.optim.lr or a warm-up (trainer.optim.warmup_steps)",
            "read that step's episodes for outliers (very long or degenerate ones)",
        ),
        _grad_spike,
        ("actor/grad_norm_max", "actor/grad_norm"),
    ),
    Rule(
        "value_loss_diverging",
        "instability",
        (
            "a lower critic learning rate (trainer.critic.lr)",
            "value clipping (trainer.critic.value_clip)",
            "a smaller trainer.critic.value_loss_coef",
            "a critic-free estimator (trainer.advantage.estimator=grpo)",
        ),
        _value_diverging,
        ("loss/value",),
        baseline=5,
    ),
    Rule(
        "is_ratio_far_from_1",
        "mismatch",
        (
            "rollout correction: trainer.correction.is_level=token (TIS) or mask_level=token",
            "less staleness (orchestration.max_staleness, partial_rollout=false)",
            "the same temperature in vLLM and trainer.actor.temperature",
            "check tokenization: `agentrl doctor tokenizer`",
        ),
        _is_ratio,
        ("offpolicy/rho_mean", "correction/is_weight_mean"),
    ),
    Rule(
        "reward_up_heldout_flat",
        "reward_hacking",
        (
            "read episodes: `agentrl view RUN_DIR`",
            "check the scorer: `agentrl doctor reward --env ENV`",
            "more (or more varied) training tasks",
            "a KL penalty (trainer.kl.coef)",
        ),
        _reward_vs_heldout,
        ("success",),
        baseline=5,
    ),
    Rule(
        "all_discarded",
        "broken_episodes",
        (
            "read the first traceback (the run prints it once) or any other: "
            "RUN_DIR/discarded/step_N.parquet, `agentrl view RUN_DIR --web`",
            "agent_error: run the agent's solve once by hand against a served model",
            "env_error: `agentrl doctor env --env ENV`",
            "llm_error: the inference server logs (RUN_DIR/logs/)",
            "tokenization_error: `agentrl doctor tokenizer --model PATH`",
            "orchestration.max_all_discarded_steps: such steps in a row before the run "
            "stops (0: never)",
        ),
        _all_discarded,
        ("episodes/generated",),
    ),
)
"""Every dashboard rule, in dashboard order."""
