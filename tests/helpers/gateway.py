"""Doubles of the gateway tests: a recording LLM client, a ``python`` tool (in the chat,
Responses and Anthropic formats) and its call, a started gateway and real SDK clients."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from agentrl.gateway.server import Gateway
from agentrl.gateway.session import GatewayLimits
from agentrl.gateway.transport import in_process_client
from agentrl.inference.protocol import Generation, SamplingParams
from agentrl.rollout import LoopConfig
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy

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


# The same python tool in the Responses API's and Anthropic's formats.
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "python",
        "description": "Runs code.",
        "parameters": TOOLS[0]["function"]["parameters"],
    }
]
ANTHROPIC_TOOLS = [
    {
        "name": "python",
        "description": "Runs code.",
        "input_schema": TOOLS[0]["function"]["parameters"],
    }
]


def tool_then_answer(prompt: str) -> str:
    """Calls python first; answers once a tool response is in the last user turn."""
    if "<tool_response>" in prompt.rsplit("<|im_start|>user", 1)[-1]:
        return "The answer is \\boxed{4}"
    return "Let me run it.\n" + CALL


def limits(**kw: Any) -> GatewayLimits:
    """GatewayLimits from flat keywords: LoopConfig's fields go to ``loop``."""
    names = {f.name for f in dataclasses.fields(LoopConfig)}
    loop = LoopConfig(**{k: v for k, v in kw.items() if k in names})
    return GatewayLimits(loop=loop, **{k: v for k, v in kw.items() if k not in names})


@contextlib.asynccontextmanager
async def started(
    tokenizer: Any, reply: Callable[[str], str] = tool_then_answer, **kw: Any
) -> AsyncIterator[tuple[Gateway, Recording]]:
    """A started gateway over a Recording scripted LLM answering with ``reply``."""
    rec = Recording(TextPolicy(tokenizer, reply))
    async with Gateway(rec, tokenizer, limits(**kw)) as gw:
        yield gw, rec


def openai_client(gw: Gateway, session: Any, transport: str = "http") -> Any:
    """A real ``openai.AsyncOpenAI`` on the session (over HTTP, or in process)."""
    import openai

    http = in_process_client(gw) if transport == "in_process" else None
    return openai.AsyncOpenAI(
        base_url=gw.base_url(session), api_key="-", max_retries=0, http_client=http
    )


def anthropic_client(gw: Gateway, session: Any, transport: str = "http") -> Any:
    """A real ``anthropic.AsyncAnthropic`` on the session (over HTTP, or in process)."""
    import anthropic

    http = in_process_client(gw, sdk=anthropic) if transport == "in_process" else None
    return anthropic.AsyncAnthropic(
        base_url=gw.anthropic_base_url(session), api_key="-", max_retries=0, http_client=http
    )


def model_tokens(traj: Any) -> list[int]:
    """The sampled (loss mask 1) token ids of a trajectory."""
    return [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
