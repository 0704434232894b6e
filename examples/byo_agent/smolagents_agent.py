r"""Retool solved by a `smolagents <https://huggingface.co/docs/smolagents>`_ ToolCallingAgent
with a ``python`` tool, on smolagents' ``OpenAIModel`` (Chat Completions).

The agent is what smolagents' guided tour writes: a ``@tool`` function and a
``ToolCallingAgent``. The one line that is about agentrl hands the model the episode's
client (every episode has its own base URL)::

    OpenAIModel(model_id="policy", client=client)

smolagents is synchronous, so ``solve`` is a plain ``def``: it gets a sync ``openai.OpenAI``
and runs in a thread. The agent asks for ``tool_choice: "required"`` on every step, which
the gateway honours (``agent.forced_tool_choice``). Its first prompt is about 1,600
tokens, over the default ``rollout.max_total_tokens`` of 1,024. Train it
(``pip install smolagents``)::

    agentrl train --agent examples/byo_agent/smolagents_agent.py:solve --env retool \
        rollout.max_total_tokens=4096

``solve`` returns the reward: the agent's final answer's ``\boxed{}`` against the label.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import openai
from smolagents import LogLevel, OpenAIModel, ToolCallingAgent, tool

INSTRUCTIONS = (
    "Solve the math problem. Use the `python` tool for any arithmetic you cannot do exactly "
    "in your head. Give the final answer as \\boxed{ANSWER}."
)
MAX_STEPS = 4


@tool
def python(code: str) -> str:
    """Runs a Python program and returns its printed output and errors.

    Args:
        code: The complete Python program to run (print the values you want to see).
    """
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-c", code],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "timed out after 10s"
    return (proc.stdout + proc.stderr)[-2000:]


def solve(task: dict[str, Any], client: openai.OpenAI) -> float:
    """Runs the agent on the task; the reward is its final answer's correctness."""
    from agentrl.envs.retool.data import parse_task
    from agentrl.envs.retool.reward import score

    retool = parse_task(task)
    model = OpenAIModel(model_id="policy", client=client)
    agent = ToolCallingAgent(
        tools=[python],
        model=model,
        instructions=INSTRUCTIONS,
        max_steps=MAX_STEPS,
        verbosity_level=LogLevel.OFF,
    )
    answer = agent.run("\n\n".join(m.content for m in retool.messages if m.role == "user"))
    return score(str(answer), retool.answer).reward
