"""Early-stop rules: ``"kl > 2 for 20 steps"`` stops a run, with a checkpoint and the reason.

A rule is ``METRIC OP VALUE [for N step(s)]``: METRIC is a metric key of metrics.jsonl
(``kl/ref_kl``) or a short name (:data:`ALIASES`), OP one of ``< <= > >=``, N (default 1)
the number of consecutive training steps the condition must hold. A step without the
metric breaks the streak.

Example:
    >>> stop = EarlyStop(["entropy < 0.05 for 2 steps"])
    >>> stop.update(1, {"actor/entropy": 0.01}) is None
    True
    >>> stop.update(2, {"actor/entropy": 0.02})
    'entropy < 0.05 for 2 steps: actor/entropy = 0.02 at step 2 (since step 1)'
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.reporting.discards import DiscardLog
from agentrl.reporting.doctor import LiveDoctor
from agentrl.types import Trajectory

__all__ = ["ALIASES", "EarlyStop", "RunWatch", "StopRule", "parse_rule"]

ALIASES: dict[str, tuple[str, ...]] = {
    "kl": ("kl/ref_kl", "kl/ref_kl_old"),
    "entropy": ("actor/entropy", "entropy/old"),
    "reward": ("reward/mean",),
    "grad_norm": ("actor/grad_norm",),
    "truncated": ("response/truncated_frac",),
    "length": ("response/length_mean",),
    "zero_std": ("reward/zero_std_group_frac",),
    "value_loss": ("loss/value",),
    "is_ratio": ("offpolicy/rho_mean",),
}
"""Short metric names → the keys they read (the first present wins)."""

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_RULE = re.compile(
    r"^\s*(?P<metric>[\w./@-]+)\s*(?P<op><=|>=|<|>)\s*(?P<value>[-+0-9.eE]+|inf|-inf)"
    r"(?:\s+for\s+(?P<n>\d+)\s+steps?)?\s*$"
)


@dataclass(frozen=True)
class StopRule:
    """One parsed rule."""

    text: str
    keys: tuple[str, ...]
    op: str
    value: float
    steps: int

    def holds(self, metrics: Mapping[str, Any]) -> tuple[str, float] | None:
        """(key, value) when the condition holds on this step's metrics."""
        for k in self.keys:
            v = metrics.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                return (k, float(v)) if _OPS[self.op](float(v), self.value) else None
        return None


def parse_rule(text: str) -> StopRule:
    """Parses ``METRIC OP VALUE [for N steps]``.

    Raises:
        ValueError: The rule does not parse (the message shows the expected form).
    """
    m = _RULE.match(text)
    if m is None:
        raise ValueError(
            f"early_stop rule {text!r} does not parse; expected 'METRIC OP VALUE [for N steps]' "
            f"with OP one of < <= > >=, e.g. 'kl > 2 for 20 steps' "
            f"(short names: {', '.join(ALIASES)}; or a metric key like actor/entropy)"
        )
    try:
        value = float(m["value"])
    except ValueError:
        raise ValueError(f"early_stop rule {text!r}: {m['value']!r} is not a number") from None
    n = int(m["n"]) if m["n"] else 1
    if n < 1:
        raise ValueError(f"early_stop rule {text!r}: N must be at least 1")
    metric = m["metric"]
    keys = ALIASES.get(metric, (metric,))
    return StopRule(" ".join(text.split()), keys, m["op"], value, n)


class EarlyStop:
    """Tracks the rules over training steps; ``update`` returns the reason to stop, once met.

    Args:
        rules: Rule texts (see the module docstring); parsed here, so a bad one fails early.
    """

    def __init__(self, rules: Sequence[str]) -> None:
        self.rules = [parse_rule(r) for r in rules]
        self._streak = [0] * len(self.rules)
        self._since = [0] * len(self.rules)
        self.reason: str | None = None

    def update(self, step: int, metrics: Mapping[str, Any]) -> str | None:
        """Adds one training step; returns the reason when a rule has held for its N steps."""
        for i, rule in enumerate(self.rules):
            hit = rule.holds(metrics)
            if hit is None:
                self._streak[i] = 0
                continue
            if self._streak[i] == 0:
                self._since[i] = step
            self._streak[i] += 1
            if self._streak[i] >= rule.steps and self.reason is None:
                key, v = hit
                self.reason = (
                    f"{rule.text}: {key} = {v:.4g} at step {step} (since step {self._since[i]})"
                )
        return self.reason


class RunWatch:
    """What a training run watches live: red flags (printed once), early-stop rules and
    discarded episodes (the first traceback, printed once; the stop after
    ``max_all_discarded_steps`` consecutive steps in which every episode was discarded).

    Args:
        rules: Early-stop rule texts.
        say: Where flag and stop messages go.
        max_all_discarded_steps: See :class:`~agentrl.reporting.discards.DiscardLog` (0: never).
        run_dir: The run directory, named in the stop message.
    """

    def __init__(
        self,
        rules: Sequence[str],
        say: Callable[[str], None],
        *,
        max_all_discarded_steps: int = 0,
        run_dir: Path | None = None,
    ) -> None:
        self.doctor = LiveDoctor()
        self.early = EarlyStop(rules)
        self.discards = DiscardLog(say, max_all_discarded_steps)
        self.run_dir = run_dir
        self.say = say

    @property
    def reason(self) -> str | None:
        """Why the run stopped early (None: it did not)."""
        return self.early.reason

    @property
    def failed(self) -> str | None:
        """Why the run must stop as failed: every episode discarded for too many steps."""
        return self.discards.stop_message

    def discarded(
        self, where: str, items: Sequence[tuple[str, Trajectory]], saved: Path | None = None
    ) -> None:
        """Notes a step's (or an evaluation's) discarded episodes; prints the run's first error."""
        self.discards.episodes(where, items, saved)

    def step(self, step: int, metrics: Mapping[str, Any]) -> bool:
        """Adds a training step; prints new red flags; True when the run must stop (an
        early-stop rule is met, or :attr:`failed`)."""
        for flag in self.doctor.step(step, metrics):
            self.say(flag.render())
        stop = self.discards.step(step, metrics, self.run_dir) is not None
        if self.early.reason is None and self.early.update(step, metrics) is not None:
            self.say(f"early stop after step {step}: {self.early.reason}")
            return True
        return stop

    def eval(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Adds an evaluation; prints new red flags."""
        for flag in self.doctor.eval(step, metrics):
            self.say(flag.render())
