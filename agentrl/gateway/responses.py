"""OpenAI wire format, answers: chat completions, their stream chunks and text completions."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.types import ToolCall

__all__ = ["Reply", "chat_body", "chat_chunks", "completion_body"]


@dataclass(frozen=True)
class Reply:
    """What one generation turned into, in OpenAI's terms (``stop_string``: the stop string
    that ended it, if one did)."""

    content: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str
    tokens: list[str]
    logprobs: list[float]
    prompt_tokens: int
    completion_tokens: int
    model: str
    reasoning: str = ""
    stop_string: str | None = None


def _usage(r: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "total_tokens": r.prompt_tokens + r.completion_tokens,
    }


def _calls(calls: Sequence[ToolCall], *, index: bool = False) -> list[dict[str, Any]]:
    out = []
    for i, c in enumerate(calls):
        d: dict[str, Any] = {
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        if index:
            d["index"] = i
        out.append(d)
    return out


def _logprobs(r: Reply) -> dict[str, Any]:
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(r.tokens, r.logprobs, strict=True)
        ]
    }


def chat_body(r: Reply, *, logprobs: bool) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": r.content or None}
    if r.reasoning:
        message["reasoning_content"] = r.reasoning  # as vLLM's reasoning parsers answer
    if r.tool_calls:
        message["tool_calls"] = _calls(r.tool_calls)
    elif message["content"] is None:
        message["content"] = ""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": r.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": _logprobs(r) if logprobs else None,
                "finish_reason": r.finish_reason,
            }
        ],
        "usage": _usage(r),
    }


def chat_chunks(r: Reply, *, logprobs: bool, include_usage: bool) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed reply, in order."""
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": r.model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **extra}
        return {**base, "choices": [choice]}

    yield chunk({"role": "assistant", "content": ""})
    if r.reasoning:
        yield chunk({"reasoning_content": r.reasoning})
    if r.content:
        yield chunk({"content": r.content}, logprobs=_logprobs(r) if logprobs else None)
    if r.tool_calls:
        yield chunk({"tool_calls": _calls(r.tool_calls, index=True)})
    yield chunk({}, r.finish_reason)
    if include_usage:
        yield {**base, "choices": [], "usage": _usage(r)}


def completion_body(r: Reply, *, logprobs: bool, stream: bool = False) -> dict[str, Any]:
    """A ``text_completion`` object (also the single chunk of a streamed one)."""
    lp = None
    if logprobs:
        lp = {
            "tokens": r.tokens,
            "token_logprobs": r.logprobs,
            "top_logprobs": None,
            "text_offset": [],
        }
    body: dict[str, Any] = {
        "id": f"cmpl-{uuid.uuid4().hex[:24]}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": r.model,
        "choices": [
            {"index": 0, "text": r.content, "logprobs": lp, "finish_reason": r.finish_reason}
        ],
    }
    if not stream:
        body["usage"] = _usage(r)
    return body
