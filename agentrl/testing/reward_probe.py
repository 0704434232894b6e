"""Pre-flight smoke test of an env's scorer (``agentrl doctor reward``).

Before spending GPU hours, feed the scorer answers whose reward you know should be 0
(an empty answer, one token, the answer format with nothing in it) next to the correct
answer, alone and buried in padding, and see what each scores. An env that pays for
an empty or format-only answer will be gamed by the policy (reward hacking).

Each probe is one turn: ``reset(task)`` then ``step(Action(text=probe, last_turn=True))``
on a fresh env; the reward of that step is the probe's score.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.env import Env, call_maybe_async
from agentrl.types import Action

__all__ = ["PROBES", "ProbeReport", "answer_of", "probe_reward", "probe_texts"]

PLACEHOLDER = "ANSWER"
PROBES = ("empty", "one_token", "format_empty", "format_only", "correct", "correct_in_padding")
_PAD = " ".join(["The quick brown fox jumps over the lazy dog."] * 40)
_ANSWER_KEYS = ("answer", "ground_truth", "label")


def answer_of(task: Mapping[str, Any]) -> str:
    """The task's reference answer: ``answer``, ``reward_model.ground_truth``, ``ground_truth``
    or ``label``.

    Raises:
        ValueError: None of them is present (the message lists the task's keys).
    """
    rm = task.get("reward_model")
    if isinstance(rm, Mapping) and rm.get("ground_truth") is not None:
        return str(rm["ground_truth"])
    for k in _ANSWER_KEYS:
        if task.get(k) is not None:
            return str(task[k])
    raise ValueError(
        f"task {task.get('id', '?')!r} has no reference answer (looked for answer, "
        f"reward_model.ground_truth, ground_truth, label; keys: {sorted(task)})"
    )


def probe_texts(answer: str, answer_format: str = PLACEHOLDER) -> dict[str, str]:
    """The probe answers for one reference answer; ``answer_format`` holds ``ANSWER``."""
    if PLACEHOLDER not in answer_format:
        raise ValueError(f"answer format {answer_format!r} must contain {PLACEHOLDER!r}")
    correct = answer_format.replace(PLACEHOLDER, answer)
    wrong = "1" if answer.strip() == "0" else "0"  # the format right, the content wrong
    return {
        "empty": "",
        "one_token": "x",
        "format_empty": answer_format.replace(PLACEHOLDER, ""),
        "format_only": answer_format.replace(PLACEHOLDER, wrong),
        "correct": correct,
        "correct_in_padding": f"{_PAD}\n{correct}\n{_PAD}",
    }


@dataclass
class ProbeReport:
    """Scores per probe over the tasks tried, and what looks wrong.

    Attributes:
        scores: Probe name → the reward of each task.
        texts: Probe name → the text fed for the first task.
        flags: One sentence per problem found (empty: the scorer looks sound).
    """

    scores: dict[str, list[float]] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)

    def mean(self, probe: str) -> float:
        return statistics.fmean(self.scores[probe]) if self.scores.get(probe) else float("nan")

    def summary(self) -> str:
        """A table of probes and scores, then the flags."""
        lines = [f"{'probe':<20} {'mean':>8} {'min':>8} {'max':>8}  text"]
        for p in PROBES:
            s = self.scores.get(p, [])
            if not s:
                continue
            text = self.texts[p].replace("\n", " ")
            text = repr(text if len(text) <= 40 else text[:18] + "…" + text[-18:])
            lines.append(f"{p:<20} {self.mean(p):>8.3g} {min(s):>8.3g} {max(s):>8.3g}  {text}")
        lines += [f"RED FLAG: {f}" for f in self.flags] or ["ok: no red flag"]
        return "\n".join(lines)


async def _score(env_cls: type[Env], env_kwargs: Mapping[str, Any], task: Any, text: str) -> float:
    env = env_cls(**env_kwargs)
    try:
        await call_maybe_async(env.reset, task, seed=0)
        res = await call_maybe_async(env.step, Action(text=text, content=text, last_turn=True))
        return float(res.reward)
    finally:
        await call_maybe_async(env.close)


async def probe_reward(
    env_cls: type[Env],
    tasks: Sequence[Mapping[str, Any]],
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    answer_format: str = PLACEHOLDER,
) -> ProbeReport:
    """Scores every probe on every task and flags a scorer that can be gamed.

    Flags: an empty, one-token, empty-in-format or format-only (right format, wrong content)
    answer with a positive reward (on any task);
    a correct answer that does not score above the empty one (on average: the format is
    probably wrong, see ``answer_format``).

    Raises:
        ValueError: No tasks, or a task without a reference answer.
    """
    if not tasks:
        raise ValueError("no tasks to probe the scorer with")
    kwargs = dict(env_kwargs or {})
    rep = ProbeReport(scores={p: [] for p in PROBES})
    for i, task in enumerate(tasks):
        texts = probe_texts(answer_of(task), answer_format)
        if i == 0:
            rep.texts = texts
        for p in PROBES:
            rep.scores[p].append(await _score(env_cls, kwargs, task, texts[p]))
    for p, what in (
        ("empty", "an empty answer"),
        ("one_token", "a one-token answer"),
        ("format_empty", f"an empty answer in the format ({rep.texts['format_empty']!r})"),
        ("format_only", f"a format-only (wrong) answer ({rep.texts['format_only']!r})"),
    ):
        if max(rep.scores[p]) > 0:
            rep.flags.append(
                f"{what} is rewarded (up to {max(rep.scores[p]):.3g}): the policy can learn to "
                "collect reward without solving the task"
            )
    if not rep.mean("correct") > rep.mean("empty"):
        rep.flags.append(
            f"the correct answer ({rep.texts['correct']!r}) scores {rep.mean('correct'):.3g}, no "
            f"more than an empty one: the scorer does not see it (wrong --format?)"
        )
    return rep
