"""Warm-start data for the tiny model: demonstrations and copy drills.

An env can offer demonstrations of its episodes for SFT with a static method
``demonstrations(n, *, seed) -> list[Demo]`` (the built-in ``retool`` does); the
tiny model's recipe names the env and asks it through the env registry, so this
package never imports an env.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Demo", "copy_drills"]


@dataclass(frozen=True)
class Demo:
    """One demonstration: a conversation and the tool schemas shown with it.

    Attributes:
        messages: OpenAI-style chat messages; the assistant turns are learned.
        tools: Tool schemas (OpenAI function format) rendered by the chat template.
        answer: The task's correct answer, for checks.
        uses_tool: Whether the demonstration calls a tool.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    answer: str = ""
    uses_tool: bool = False


def copy_drills(
    digit_ids: list[int], sep_ids: list[int], n: int, *, seed: int = 0, vocab: int = 3000
) -> list[tuple[list[int], list[int]]]:
    """Short token sequences that teach copying (induction) before the demonstrations.

    Each is some random filler, then a random digit string repeated three times
    with ``sep_ids`` between; the loss mask covers the repeats. Copying digits is
    what retool needs (question → code, tool output → answer) and what a tiny
    model learns slowly from the demonstrations alone.

    Returns:
        (token ids, loss mask) pairs.
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        digits = [rng.choice(digit_ids) for _ in range(rng.randint(3, 12))]
        ids = [rng.randrange(len(digit_ids) + 9, vocab) for _ in range(rng.randint(0, 16))]
        mask = [0] * len(ids)
        ids += digits
        mask += [0] * len(digits)
        for _ in range(2):
            ids += sep_ids + digits
            mask += [0] * len(sep_ids) + [1] * len(digits)
        out.append((ids, mask))
    return out
