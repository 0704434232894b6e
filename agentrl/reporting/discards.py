"""Discarded episodes as a person watching a run sees them: counts, the first traceback, the stop.

An episode is *discarded* when it broke for a reason that is not the policy's doing (its
stop reason is a failure: ``agent_error``, ``env_error``, ``llm_error``,
``tokenization_error`` …) or has no sampled token; it is not trained on. The driver counts
them per step (``episodes/generated``, ``episodes/discarded``, ``discard/episode:<reason>``)
and the run saves them with their tracebacks in ``RUN_DIR/discarded/``. Here:

* :func:`discard_counts` / :func:`describe_counts`: the reasons of a step's metrics, in words;
* :class:`DiscardLog`: prints the run's first traceback once (abridged) and tracks the
  consecutive steps where every episode was discarded, for the stop
  (``orchestration.max_all_discarded_steps``);
* :func:`eval_line` / :func:`held_out_line`: an evaluation's result that says when its
  episodes were discarded instead of printing 0.000 as if it were measured.

Example:
    >>> describe_counts({"agent_error": 3, "env_error": 1})
    'agent_error 3, env_error 1'
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.types import StopReason, Trajectory

__all__ = [
    "DiscardLog",
    "FirstError",
    "abridge",
    "all_discarded",
    "describe_counts",
    "discard_counts",
    "eval_discards",
    "eval_line",
    "held_out_line",
    "last_line",
]

MAX_LINES = 24
"""Lines of the first traceback the console shows (its head and its end are kept)."""
MAX_WIDTH = 300
"""Characters a shown line keeps (an HTML error page in one line stays readable)."""
SETTING = "orchestration.max_all_discarded_steps"


def _clip(line: str, width: int = MAX_WIDTH) -> str:
    return line if len(line) <= width else f"{line[: width - 1]}…"


def abridge(text: str, max_lines: int = MAX_LINES, width: int = MAX_WIDTH) -> str:
    """``text`` in at most ``max_lines`` lines of at most ``width`` characters.

    A longer text keeps its first 3 lines (where a traceback starts) and its last lines
    (the innermost frames and the error itself), with a line saying how many were left out.

    Example:
        >>> abridge("\\n".join(str(i) for i in range(10)), max_lines=6)
        '0\\n1\\n2\\n… (5 lines left out) …\\n8\\n9'
    """
    lines = [_clip(x, width) for x in text.rstrip().splitlines()]
    if len(lines) <= max_lines:
        return "\n".join(lines)
    head, tail = 3, max(max_lines - 4, 1)
    left_out = len(lines) - head - tail
    return "\n".join([*lines[:head], f"… ({left_out} lines left out) …", *lines[-tail:]])


def last_line(text: str | None) -> str:
    """The last non-empty line of an error text (a traceback's exception), clipped."""
    for line in reversed((text or "").splitlines()):
        if line.strip():
            return _clip(line.strip())
    return "(no error text recorded)"


def discard_counts(metrics: Mapping[str, Any]) -> Counter[str]:
    """Episodes discarded per reason, from a step's ``discard/episode:<reason>`` metrics."""
    out: Counter[str] = Counter()
    for k, v in metrics.items():
        if k.startswith("discard/episode:") and isinstance(v, (int, float)) and v:
            out[k.removeprefix("discard/episode:")] += int(v)
    return out


def describe_counts(counts: Mapping[str, int]) -> str:
    """``reason n, reason m`` (most first, then by name)."""
    return ", ".join(f"{r} {n}" for r, n in sorted(counts.items(), key=lambda x: (-x[1], x[0])))


def _number(metrics: Mapping[str, Any], key: str) -> int | None:
    v = metrics.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        return None
    return int(v)


def all_discarded(metrics: Mapping[str, Any]) -> bool:
    """Whether a training step generated episodes and discarded every one of them."""
    n = _number(metrics, "episodes/generated")
    d = _number(metrics, "episodes/discarded")
    return n is not None and d is not None and n > 0 and d >= n


def eval_discards(res: Mapping[str, Any]) -> tuple[int, int, Counter[str]]:
    """(discarded, episodes, per failure reason) of an evaluation's metrics."""
    n = _number(res, "episodes") or 0
    d = _number(res, "discarded") or 0
    reasons: Counter[str] = Counter()
    for r in StopReason:
        c = _number(res, f"stop/{r}")
        if r.is_failure and c:
            reasons[str(r)] = c
    return d, n, reasons


def _eval_note(res: Mapping[str, Any]) -> tuple[bool, str]:
    """(measured, note): measured is False when every episode was discarded; the note
    counts the discarded episodes and their reasons ("" when none was)."""
    d, n, reasons = eval_discards(res)
    if not d:
        return True, ""
    why = f" ({describe_counts(reasons)})" if reasons else ""
    if d >= n > 0:
        return False, f"all {n} evaluation episodes were discarded{why}"
    return True, f"{d} of {n} evaluation episodes discarded{why}, counted as not solved"


def eval_line(step: int, res: Mapping[str, Any]) -> str:
    """The run's line for an evaluation (``eval @ step N: success …``).

    Example:
        >>> res = {"success": 0.0, "episodes": 4, "discarded": 4, "stop/env_error": 4}
        >>> eval_line(0, res).split(": ", 1)[1]
        'success not measured: all 4 evaluation episodes were discarded (env_error 4)'
    """
    measured, note = _eval_note(res)
    if not measured:
        return f"eval @ step {step}: success not measured: {note}"
    return f"eval @ step {step}: success {res['success']:.3f}" + (f"; {note}" if note else "")


def held_out_line(before: Mapping[str, Any], after: Mapping[str, Any], steps: int) -> str:
    """The run's closing line on held-out success (a resumed run has no "before").

    An evaluation whose episodes were all discarded is "not measured", never 0.000; one
    with some discarded episodes says how many.
    """
    end = f"after {steps} steps"
    a_ok, a_note = _eval_note(after)
    b_ok, b_note = _eval_note(before) if "success" in before else (True, "")
    if not b_ok:
        b_text = f"before training: not measured{'' if a_ok else ' either'}, {b_note}"
    elif "success" in before:
        b_text = f"before training: {before['success']:.3f}" + (f", {b_note}" if b_note else "")
    else:
        b_text = ""
    if not a_ok:
        line = (
            f"held-out success: not measured {end}: {a_note}; their errors are in the run "
            f"directory's discarded/"
        )
        return line + (f"; {b_text}" if b_text else "")
    a = after["success"]
    if "success" not in before:  # a resumed run does not evaluate its starting point again
        line = f"held-out success: {a:.3f} (resumed run: the starting figure is in metrics.jsonl)"
        return f"{line} {end}" + (f"; {a_note}" if a_note else "")
    if not b_ok:
        return f"held-out success: {a:.3f} {end} ({b_text})" + (f"; {a_note}" if a_note else "")
    b = before["success"]
    notes = [f"before: {b_note}"] if b_note else []
    notes += [f"after: {a_note}"] if a_note else []
    line = f"held-out success: {b:.3f} → {a:.3f} ({a - b:+.3f}) {end}"
    return line + "".join(f"; {x}" for x in notes)


@dataclass(frozen=True)
class FirstError:
    """The first discarded episode of a run that carried an error text."""

    where: str
    """``step N`` or ``eval @ step N``."""
    reason: str
    episode_id: str
    error: str
    saved: Path | None

    def render(self) -> str:
        """The console block: where, reason, episode id, the file, the abridged traceback."""
        head = f"first discarded episode ({self.where}, episode {self.episode_id}, {self.reason})"
        if self.saved is not None:
            head += f"; every discarded episode is saved with its error in {self.saved.parent}/"
        body = "\n".join(f"  {x}" for x in abridge(self.error).splitlines())
        return f"{head}:\n{body}"


class DiscardLog:
    """Prints the run's first traceback once; counts consecutive all-discarded steps.

    Args:
        say: Where messages go.
        max_all_discarded_steps: Consecutive steps in which every episode is discarded
            after which :meth:`step` returns the stop message (0: never).
    """

    def __init__(self, say: Callable[[str], None], max_all_discarded_steps: int = 0) -> None:
        self.say = say
        self.limit = max_all_discarded_steps
        self.first: FirstError | None = None
        self.streak = 0
        self.streak_since = 0
        self.streak_reasons: Counter[str] = Counter()
        self.stop_message: str | None = None

    def episodes(
        self, where: str, items: Sequence[tuple[str, Trajectory]], saved: Path | None = None
    ) -> None:
        """Notes discarded episodes (``saved``: their file); prints the run's first error."""
        if self.first is not None:
            return
        for reason, t in items:
            if t.error and t.error.strip():
                self.first = FirstError(where, reason, t.episode_id, t.error, saved)
                self.say(self.first.render())
                return

    def step(
        self, step: int, metrics: Mapping[str, Any], run_dir: Path | None = None
    ) -> str | None:
        """Adds a training step; returns the stop message once the limit is reached."""
        if not all_discarded(metrics):
            self.streak, self.streak_reasons = 0, Counter()
            return None
        if self.streak == 0:
            self.streak_since = step
        self.streak += 1
        self.streak_reasons += discard_counts(metrics)
        if self.limit and self.streak >= self.limit and self.stop_message is None:
            self.stop_message = self._message(step, run_dir)
            return self.stop_message
        return None

    def _message(self, step: int, run_dir: Path | None) -> str:
        n = sum(self.streak_reasons.values())
        steps = (
            f"step ({step})"
            if self.streak == 1
            else f"{self.streak} steps ({self.streak_since}-{step})"
        )
        root = str(run_dir) if run_dir is not None else "RUN_DIR"
        first = (
            f"first error ({self.first.where}, episode {self.first.episode_id}, "
            f"{self.first.reason}): {last_line(self.first.error)}"
            if self.first is not None
            else "no error text was recorded"
        )
        return (
            f"the run stopped after step {step}: every episode of the last {steps} was "
            f"discarded, so nothing was trained ({n} episodes: "
            f"{describe_counts(self.streak_reasons)}); {first}; every discarded episode "
            f"is saved with its traceback in {root}/discarded/ (agentrl view {root} --web "
            f"lists them); this stop is {SETTING}={self.limit} (0: never stop)"
        )
