r"""Retool solved by an `openai-agents <https://openai.github.io/openai-agents-python/>`_ Agent
on its default model, which speaks OpenAI's Responses API (``POST /v1/responses``).

The agent is what its library's quickstart writes: an ``Agent`` with a ``@function_tool``,
run by ``Runner.run``. The one line that is about agentrl hands the episode's client to the
run (every episode has its own base URL, so a process-wide default client would not do)::

    RunConfig(model_provider=OpenAIProvider(openai_client=client))

Train it (``pip install openai-agents``)::

    agentrl train --agent examples/byo_agent/openai_agents_agent.py:solve --env retool

``solve`` returns None: ``score`` reads the last ``\boxed{}`` answer of the conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

import openai
from agents import (
    Agent,
    MaxTurnsExceeded,
    OpenAIProvider,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)

set_tracing_disabled(True)  # traces would be sent to OpenAI's servers

INSTRUCTIONS = (
    "Solve the math problem. You can run Python code with the `python` tool: it returns "
    "what the program prints. Use it for any arithmetic you cannot do exactly in your head. "
    "When you know the answer, write it as \\boxed{ANSWER}."
)
MAX_TURNS = 4


@function_tool
async def python(code: str) -> str:
    """Runs a Python program and returns its printed output and errors.

    Args:
        code: The complete Python program to run (print the values you want to see).
    """
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", code,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 10)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return "timed out after 10s"
    return out.decode(errors="replace")[-2000:]


AGENT = Agent(name="retool", instructions=INSTRUCTIONS, tools=[python])


def task_input(task: dict[str, Any]) -> list[dict[str, Any]] | str:
    """The task's prompt as Responses input (a string prompt is one user message)."""
    prompt = task.get("prompt") or task.get("question") or ""
    return prompt if isinstance(prompt, str) else [dict(m) for m in prompt]


async def solve(task: dict[str, Any], client: openai.AsyncOpenAI) -> float | None:
    """Runs the agent on the task; ``score`` gives the reward."""
    config = RunConfig(model_provider=OpenAIProvider(openai_client=client))
    with contextlib.suppress(MaxTurnsExceeded):  # scored as it stands
        await Runner.run(AGENT, task_input(task), run_config=config, max_turns=MAX_TURNS)
    return None


def score(task: dict[str, Any], messages: list[dict[str, Any]]) -> float:
    r"""1.0 when the last assistant message's ``\boxed{}`` answer matches the task's label."""
    from agentrl.envs.retool.data import parse_task
    from agentrl.envs.retool.reward import score as boxed_score

    answer = parse_task(task).answer
    replies = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
    return boxed_score(replies[-1], answer).reward if replies else 0.0
