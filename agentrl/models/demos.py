"""Synthetic retool demonstrations for warm-starting the tiny model.

The contract shared with ``envs/retool``: a tool named ``python`` taking
``code: str``; the assistant calls it with ``print(<expression>)``, reads the tool
response, and answers with ``The answer is \\boxed{<number>}.``. A fraction of the
demonstrations skip the tool and guess (a wrong or rounded number), so the warm
start is deliberately partial and RL has something to improve.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PYTHON_TOOL",
    "Demo",
    "copy_drills",
    "retool_demonstrations",
    "retool_question",
]

PYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Runs Python code and returns what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source to run."}},
            "required": ["code"],
        },
    },
}

_QUESTIONS = (
    "What is {e}?",
    "Compute {e}.",
    "Calculate {e}.",
    "What is the value of {e}?",
    "Find {e}.",
)
_SYSTEMS = (None, None, "You are a helpful assistant.", "Solve the problem. Use the python tool.")


@dataclass(frozen=True)
class Demo:
    """One demonstration.

    Attributes:
        messages: OpenAI-style chat messages (system optional, user, assistant, tool, assistant).
        answer: The correct answer as a string.
        uses_tool: Whether the assistant called the tool.
    """

    messages: list[dict[str, Any]]
    answer: str
    uses_tool: bool


def retool_question(rng: random.Random) -> tuple[str, str, str]:
    """A random arithmetic question, its answer and its expression.

    Example: ("What is 48213 * 7719?", "372156147", "48213 * 7719").
    """
    op = rng.choice(["+", "-", "*", "*"])
    a = rng.randint(10, 99999)
    b = rng.randint(2, 9999)
    expr = f"{a} {op} {b}"
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return rng.choice(_QUESTIONS).format(e=expr), str(value), expr


def _guess(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: right leading digits, the rest garbled."""
    digits = answer.lstrip("-")
    keep = rng.randint(1, max(1, len(digits) - 1))
    tail = "".join(str(rng.randint(0, 9)) for _ in range(len(digits) - keep))
    out = digits[:keep] + tail
    if out == digits:
        out = digits[:-1] + str((int(digits[-1]) + 1) % 10)
    return ("-" if answer.startswith("-") else "") + out


def retool_demonstrations(n: int, *, seed: int = 0, tool_rate: float = 0.7) -> list[Demo]:
    """Makes ``n`` deterministic demonstrations.

    Args:
        n: How many.
        seed: RNG seed.
        tool_rate: Fraction that call the tool and answer correctly; the rest
            answer at once with a guess.
    """
    rng = random.Random(seed)
    demos = []
    for i in range(n):
        question, answer, expr = retool_question(rng)
        msgs: list[dict[str, Any]] = []
        system = rng.choice(_SYSTEMS)
        if system:
            msgs.append({"role": "system", "content": system})
        msgs.append({"role": "user", "content": question})
        uses_tool = rng.random() < tool_rate
        if uses_tool:
            call_id = f"call_{i}"
            msgs += [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "python", "arguments": {"code": f"print({expr})"}},
                        }
                    ],
                },
                {"role": "tool", "content": answer, "tool_call_id": call_id, "name": "python"},
                {"role": "assistant", "content": f"The answer is \\boxed{{{answer}}}."},
            ]
        else:
            msgs.append(
                {"role": "assistant", "content": f"The answer is \\boxed{{{_guess(answer, rng)}}}."}
            )
        demos.append(Demo(msgs, answer, uses_tool))
    return demos


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
