"""Doubles of the gateway tests: a recording LLM client and a ``python`` tool call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.inference.protocol import Generation, SamplingParams
from agentrl.testing.scripted_server import ScriptedLLM

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Runs code.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
        },
    }
]
CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(2+2)"}}</tool_call>'


class Recording:
    """An LLMClient double over a scripted policy that records every prompt and params."""

    def __init__(self, policy: Any) -> None:
        self.inner = ScriptedLLM(policy)
        self.prompts: list[list[int]] = []
        self.params: list[SamplingParams] = []
        self.fail: Exception | None = None

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        self.prompts.append(list(prompt_ids))
        self.params.append(params)
        if self.fail is not None:
            raise self.fail
        return await self.inner.generate(prompt_ids, params, session_id=session_id)
