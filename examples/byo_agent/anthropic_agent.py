r"""Retool solved by a plain ``anthropic`` client loop with a ``python`` tool (Anthropic's
Messages API, ``POST /v1/messages``).

The ``client`` annotation asks agentrl for an ``anthropic.AsyncAnthropic`` on the
episode's session (a plain ``def solve(task, client: anthropic.Anthropic)`` gets a sync
one, run in a thread). Train it::

    agentrl train --agent examples/byo_agent/anthropic_agent.py:solve --env retool

``solve`` returns None: ``score`` reads the last ``\boxed{}`` answer of the conversation.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import anthropic

SYSTEM_PROMPT = (
    "Solve the math problem. You can run Python code with the `python` tool: it returns "
    "what the program prints. Use it for any arithmetic you cannot do exactly in your head. "
    "When you know the answer, write it as \\boxed{ANSWER}."
)
TOOLS = [
    {
        "name": "python",
        "description": "Runs a Python program and returns its printed output and errors. "
        "Each call starts a fresh interpreter: print the values you want to see.",
        "input_schema": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The complete Python program to run."}
            },
            "required": ["code"],
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
    return out.decode(errors="replace")[-2000:]


async def solve(task: dict[str, Any], client: anthropic.AsyncAnthropic) -> float | None:
    """Asks, runs the python calls, sends their output back, until an answer (or MAX_TURNS)."""
    prompt = task.get("prompt") or task.get("question") or ""
    turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    system = "\n".join([SYSTEM_PROMPT, *(m["content"] for m in turns if m["role"] == "system")])
    messages: list[dict[str, Any]] = [dict(m) for m in turns if m["role"] != "system"]
    for _ in range(MAX_TURNS):
        reply = await client.messages.create(
            model="policy", max_tokens=1024, system=system, messages=messages, tools=TOOLS
        )
        messages.append(
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in reply.content],
            }
        )
        if reply.stop_reason != "tool_use":
            break  # an answer, or cut by the token budget
        results = [
            {"type": "tool_result", "tool_use_id": b.id,
             "content": await run_python(str(b.input.get("code", "")))}
            for b in reply.content if b.type == "tool_use"
        ]  # fmt: skip
        messages.append({"role": "user", "content": results})
    return None  # scored by score()


def score(task: dict[str, Any], messages: list[dict[str, Any]]) -> float:
    r"""1.0 when the last assistant message's ``\boxed{}`` answer matches the task's label
    (``messages``: the conversation as OpenAI-style dicts, whichever API the agent used)."""
    from agentrl.envs.retool.data import parse_task
    from agentrl.envs.retool.reward import score as boxed_score

    answer = parse_task(task).answer
    replies = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
    return boxed_score(replies[-1], answer).reward if replies else 0.0
