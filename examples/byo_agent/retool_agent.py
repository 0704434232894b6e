r"""Retool solved by a plain ``openai`` client loop with a ``python`` tool.

Nothing here knows about agentrl's AgentLoop: it is the kind of agent people
already have. Train it unchanged::

    agentrl train --agent examples/byo_agent/retool_agent.py:solve --env retool

(``--env retool`` only supplies the tasks; ``--tasks FILE`` works too.) The
agent returns None, so ``score`` below gives the reward: the last ``\boxed{}``
answer of the conversation against the task's label.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import openai

SYSTEM_PROMPT = (
    "Solve the math problem. You can run Python code with the `python` tool: it returns "
    "what the program prints. Use it for any arithmetic you cannot do exactly in your head. "
    "When you know the answer, write it as \\boxed{ANSWER}."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Runs a Python program and returns its printed output and errors.\n\n"
            "Each call starts a fresh interpreter: define everything you use, and print\n"
            "the values you want to see.",
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "The complete Python program to run."}
                },
                "required": ["code"],
                "additionalProperties": False,
            },
        },
    }
]
MAX_TURNS = 4


async def run_python(code: str, timeout_s: float = 10.0) -> str:
    """Runs ``code`` in a fresh interpreter; returns what it printed (cut to 2,000 chars)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", code,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return f"timed out after {timeout_s:g}s"
    text = out.decode(errors="replace")
    return (
        text[-2000:] if proc.returncode == 0 else f"{text[-2000:]}\n[exit code {proc.returncode}]"
    )


def task_messages(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The task's prompt as chat messages (a string prompt is one user message)."""
    prompt = task.get("prompt") or task.get("messages") or task.get("question")
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) for m in prompt]


async def solve(task: dict[str, Any], client: openai.AsyncOpenAI) -> float | None:
    """Asks, runs the python calls, feeds their output back, until an answer (or MAX_TURNS)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    messages += task_messages(task)
    for _ in range(MAX_TURNS):
        resp = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        choice = resp.choices[0]
        messages.append(choice.message.model_dump(exclude_none=True))
        if choice.finish_reason != "tool_calls":
            break  # an answer, or cut by the token budget
        for call in choice.message.tool_calls or []:
            try:
                code = json.loads(call.function.arguments)["code"]
            except (ValueError, KeyError, TypeError):
                out = 'error: call python with {"code": "..."}'
            else:
                out = await run_python(str(code))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
    return None  # scored by score()


def score(task: dict[str, Any], messages: list[dict[str, Any]]) -> float:
    r"""1.0 when the last assistant message's ``\boxed{}`` answer matches the task's label."""
    from agentrl.envs.retool.data import parse_task
    from agentrl.envs.retool.reward import score as boxed_score

    answer = parse_task(task).answer
    replies = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
    return boxed_score(replies[-1], answer).reward if replies else 0.0
