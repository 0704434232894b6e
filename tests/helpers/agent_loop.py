"""Shared doubles for AgentLoop tests: an env with one `add` tool and a scripted policy for it."""

from __future__ import annotations

import re

from agentrl import Action, Env, Message, StepResult
from agentrl.tools import tool


class AddEnv(Env):
    """Asks for a sum (2+3 unless the task names ``a`` and ``b``); the model may call `add`.

    Reward 1 for the right final answer (``ANSWER <n>``), which ends the episode.
    """

    def reset(self, task, *, seed=None):
        self.a, self.b = task.get("a", 2), task.get("b", 3)
        return [Message.system("Use tools."), Message.user(f"What is {self.a}+{self.b}?")]

    @tool
    def add(self, a: int, b: int) -> int:
        """Adds two integers.

        Args:
            a: First addend.
            b: Second addend.
        """
        return a + b

    def tools(self):
        return [self.add]

    def step(self, action: Action) -> StepResult:
        m = re.search(r"ANSWER (\d+)", action.content)
        if m:
            return StepResult(reward=float(int(m.group(1)) == self.a + self.b), terminated=True)
        return StepResult()


def tool_then_answer(prompt: str) -> str:
    """A scripted hermes-format policy: call `add` first, then answer with what the tool said."""
    responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt, re.S)
    if not responses:
        a, b = re.findall(r"What is (\d+)\+(\d+)\?", prompt)[0]
        return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    return f"ANSWER {responses[-1]}"
