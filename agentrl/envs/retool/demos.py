"""Demonstrations of retool episodes, for warm-starting a model by SFT.

Each demonstration is what :class:`~agentrl.envs.retool.RetoolEnv` would show the
model (its system prompt, the task, its ``python`` tool schema) followed by a
reply. A tool-using reply calls ``python`` with the task's reference solution,
reads the interpreter's output and answers ``The answer is \\boxed{N}.``; the
others answer at once with a wrong guess. How often each problem kind uses the
tool is set per kind, so a model trained on them has a partial skill: it uses the
interpreter on some kinds of problem and guesses on others, and RL has room to
teach it when the tool pays.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from agentrl.models.demos import Demo
from agentrl.tools import Tool
from agentrl.types import Message

from .data import Level, generate_tasks

__all__ = ["TINY_TOOL_RATES", "RetoolPrompt", "demonstrations", "wrong_guess"]


class RetoolPrompt(Protocol):
    """What a demonstration shows of the env (:class:`~agentrl.envs.retool.RetoolEnv`)."""

    def reset(self, task: Mapping[str, Any], *, seed: int | None = None) -> list[Message]:
        """The system and prompt messages of ``task``."""
        ...

    def tools(self) -> Sequence[Tool]:
        """The env's tools."""
        ...


TINY_TOOL_RATES: Mapping[str, float] = {
    "product": 0.7,
    "leftover": 0.4,
    "sum": 0.3,
    "product_minus": 0.15,
}
"""Share of demonstrations that use the tool, per problem kind (others: 0.5)."""


def wrong_guess(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: the right leading digits, the rest garbled."""
    digits = answer.lstrip("-")
    keep = rng.randint(0, max(0, len(digits) - 1))
    out = digits[:keep] + "".join(str(rng.randint(0, 9)) for _ in range(len(digits) - keep))
    if out == digits:
        out = digits[:-1] + str((int(digits[-1]) + 1) % 10)
    return ("-" if answer.startswith("-") else "") + out


def demonstrations(
    env: RetoolPrompt,
    n: int,
    *,
    seed: int = 0,
    level: Level | str = Level.TINY,
    tool_rates: Mapping[str, float] = TINY_TOOL_RATES,
) -> list[Demo]:
    """``n`` deterministic demonstrations on train-split problems.

    Args:
        env: The retool env whose system prompt and ``python`` tool the demonstrations show.
        n: How many.
        seed: Seeds the problems and which demonstrations use the tool.
        level: Problem level (see :class:`~agentrl.envs.retool.data.Level`).
        tool_rates: Per problem kind, the share of demonstrations that use the tool.
    """
    tools = [t.schema() for t in env.tools()]
    rng = random.Random(f"retool-demos:{seed}")
    out = []
    for i, row in enumerate(generate_tasks(n, split="train", seed=seed, level=level)):
        messages: list[dict[str, Any]] = [m.to_dict() for m in env.reset(row)]
        answer = row["reward_model"]["ground_truth"]
        uses_tool = rng.random() < tool_rates.get(row["kind"], 0.5)
        if uses_tool:
            call = {"name": "python", "arguments": {"code": row["solution"]}}
            messages += [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": f"call_{i}", "type": "function", "function": call}],
                },
                {"role": "tool", "content": answer, "tool_call_id": f"call_{i}", "name": "python"},
            ]
            reply = answer
        else:
            reply = wrong_guess(answer, rng)
        messages.append({"role": "assistant", "content": f"The answer is \\boxed{{{reply}}}."})
        out.append(Demo(messages=messages, tools=tools, answer=answer, uses_tool=uses_tool))
    return out
