"""Anthropic's Messages API (``POST /v1/messages``) over a session's exact-token chat record.

A request becomes a chat request (``system`` a system message, ``text`` blocks message
text, an assistant's ``tool_use`` blocks its tool calls, a user's ``tool_result``
blocks tool messages), is answered by :meth:`Session.chat` exactly as
``/v1/chat/completions`` is (the same record, tokens, logprobs and weight versions),
and the reply becomes ``text`` and ``tool_use`` content blocks with Anthropic's
``stop_reason``. Errors are Anthropic's error bodies, so the ``anthropic`` client
raises its own exception classes.

The Anthropic client's base URL is the session URL without ``/v1``
(``http://HOST:PORT/sessions/{token}``): the client appends ``/v1/messages``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agentrl.gateway.openai_api import (
    ApiError,
    ChatRequest,
    Sampling,
    chat_dict,
    check_tool_choice,
    int_field,
    number_field,
)
from agentrl.gateway.responses import Reply
from agentrl.types import Message, ToolCall

__all__ = ["MessagesRequest", "message_body", "message_events", "parse_messages_request"]

_KEYS = {
    "messages", "system", "tools", "tool_choice", "max_tokens", "temperature", "top_p",
    "top_k", "stop_sequences", "stream",
}  # fmt: skip
# Accepted and ignored: they do not change what is sampled. (``thinking``: the policy
# thinks as its chat template and rollout.reasoning_parser say; ``output_config``: its
# effort, while a ``format`` is refused.)
_IGNORED = {
    "model", "metadata", "service_tier", "thinking", "inference_geo", "cache_control",
    "diagnostics", "speed", "user_profile_id", "workspace_id", "output_config",
}  # fmt: skip


@dataclass(frozen=True)
class MessagesRequest:
    """A validated Messages request: the chat request it becomes."""

    chat: ChatRequest
    stream: bool = False


def _bad(message: str, param: str = "messages") -> ApiError:
    return ApiError(400, message, param=param)


def _block_text(block: Any, where: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else type(block).__name__
    if kind != "text":
        raise _bad(f"{where}: only text blocks are supported here, got {kind!r}")
    return str(block.get("text", ""))


def _texts(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}: content must be a string or a list of blocks")
    return "".join(_block_text(b, where) for b in content)


def _system(raw: Any) -> str:
    if raw is None or isinstance(raw, str):
        return raw or ""
    if isinstance(raw, list):
        return "\n".join(_block_text(b, "system") for b in raw)
    raise _bad("'system' must be a string or a list of text blocks", "system")


def _assistant(content: Any, where: str) -> Message:
    if isinstance(content, str):
        return Message.assistant(content)
    if not isinstance(content, list):
        raise _bad(f"{where}: content must be a string or a list of blocks")
    text, calls = [], []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            text.append(str(b.get("text", "")))
        elif kind == "tool_use":
            args = b.get("input") or {}
            if not isinstance(args, dict) or not isinstance(b.get("name"), str):
                raise _bad(f"{where}.content[{j}]: a tool_use needs a name and an input object")
            calls.append(ToolCall(b["name"], args, str(b.get("id", ""))))
        elif kind in ("thinking", "redacted_thinking"):
            continue  # the record keeps the reasoning the model sampled
        else:
            raise _bad(f"{where}.content[{j}]: assistant blocks of type {kind!r} are not "
                       "supported (text, tool_use and thinking are)")  # fmt: skip
    return Message("assistant", "".join(text), tuple(calls))


def _user(content: Any, where: str) -> list[Message]:
    if isinstance(content, str):
        return [Message.user(content)]
    if not isinstance(content, list):
        raise _bad(f"{where}: content must be a string or a list of blocks")
    out: list[Message] = []
    text: list[str] = []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            text.append(str(b.get("text", "")))
        elif kind == "tool_result":
            if text:  # text before a result: a user turn of its own, in order
                out.append(Message.user("".join(text)))
                text = []
            result = b.get("content", "")
            out.append(Message.tool(_texts(result, f"{where}.content[{j}]"),
                                    tool_call_id=str(b.get("tool_use_id", ""))))  # fmt: skip
        else:
            raise _bad(f"{where}.content[{j}]: user blocks of type {kind!r} are not "
                       "supported (text and tool_result are)")  # fmt: skip
    if text:
        out.append(Message.user("".join(text)))
    return out


def _messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list")
    out: list[Message] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            out += _user(m.get("content", ""), where)
        elif role == "assistant":
            out.append(_assistant(m.get("content", ""), where))
        else:
            raise _bad(f"{where}: role must be user or assistant (system goes in 'system')")
    return out


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad("'tools' must be a list", "tools")
    out = []
    for t in raw:
        if (
            not isinstance(t, dict)
            or not isinstance(t.get("name"), str)
            or (t.get("type") not in (None, "custom"))
        ):
            kind = t.get("type") if isinstance(t, dict) else type(t).__name__
            raise _bad(f"tools of type {kind!r} are not supported: only client tools "
                       "({name, description, input_schema}) are", "tools")  # fmt: skip
        fn = {"name": t["name"], "parameters": t.get("input_schema") or {"type": "object"}}
        if t.get("description"):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _choice(raw: Any, tools: list[dict[str, Any]]) -> tuple[str, str | None]:
    kind = raw.get("type") if isinstance(raw, dict) else raw
    choice = {None: "auto", "auto": "auto", "none": "none", "any": "required",
              "tool": "required"}.get(kind)  # fmt: skip
    if choice is None:
        raise _bad(f"tool_choice {raw!r} is not supported (auto, any, tool, none)", "tool_choice")
    name = raw.get("name") if kind == "tool" and isinstance(raw, dict) else None
    if kind == "tool" and not isinstance(name, str):
        raise _bad("tool_choice of type tool needs a name", "tool_choice")
    check_tool_choice(choice, name, [t["function"]["name"] for t in tools])
    return choice, name


def parse_messages_request(body: Any) -> MessagesRequest:
    """Validates a Messages request.

    Raises:
        ApiError: 400 naming what is malformed or unsupported.
    """
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    for key in body:
        if key not in _KEYS and key not in _IGNORED:
            raise _bad(f"unsupported parameter '{key}' for /v1/messages (the agentrl gateway "
                       f"accepts: {', '.join(sorted(_KEYS))})", key)  # fmt: skip
    config = body.get("output_config")
    if isinstance(config, dict) and config.get("format"):
        raise _bad("output_config.format (structured output) is not supported", "output_config")
    if body.get("top_k") not in (None, -1, 0):
        raise _bad("'top_k' is not supported: it changes the sampling distribution", "top_k")
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _bad("'stop_sequences' must be a list of non-empty strings", "stop_sequences")
    system = _system(body.get("system"))
    messages = _messages(body.get("messages"))
    if messages[-1].role == "assistant":
        raise _bad("a last assistant message (a prefilled reply) is not supported: the "
                   "gateway samples whole turns")  # fmt: skip
    if system:
        messages = [Message.system(system), *messages]
    tools = _tools(body.get("tools"))
    choice, name = _choice(body.get("tool_choice"), tools)
    sampling = Sampling(
        temperature=number_field(body, "temperature", 0.0, 1.0),
        top_p=number_field(body, "top_p", 0.0, 1.0),
        max_tokens=int_field(body, "max_tokens", 1),
        stop=tuple(stops),
    )
    chat = ChatRequest(
        messages=messages, raw_messages=[chat_dict(m) for m in messages], tools=tools,
        tool_choice=choice, tool_name=name, sampling=sampling,
    )  # fmt: skip
    return MessagesRequest(chat=chat, stream=bool(body.get("stream")))


def _stop_reason(r: Reply) -> str:
    if r.tool_calls:
        return "tool_use"
    if r.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if r.stop_string is not None else "end_turn"


def _blocks(r: Reply) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if r.reasoning:
        out.append({"type": "thinking", "thinking": r.reasoning, "signature": ""})
    if r.content or not r.tool_calls:
        out.append({"type": "text", "text": r.content, "citations": None})
    for c in r.tool_calls:
        out.append({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments})
    return out


def message_body(r: Reply) -> dict[str, Any]:
    """The ``message`` object of a reply."""
    return {
        "id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
        "model": r.model, "content": _blocks(r), "stop_reason": _stop_reason(r),
        "stop_sequence": r.stop_string if not r.tool_calls else None,
        "usage": {
            "input_tokens": r.prompt_tokens, "output_tokens": r.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
        },
    }  # fmt: skip


def _deltas(block: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the block as it starts, its deltas)."""
    if block["type"] == "text":
        return {**block, "text": ""}, [{"type": "text_delta", "text": block["text"]}]
    if block["type"] == "thinking":
        return {**block, "thinking": ""}, [
            {"type": "thinking_delta", "thinking": block["thinking"]},
            {"type": "signature_delta", "signature": block["signature"]},
        ]
    args = json.dumps(block["input"], ensure_ascii=False)
    return {**block, "input": {}}, [{"type": "input_json_delta", "partial_json": args}]


def message_events(msg: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The server-sent events of a streamed message, in the order Anthropic sends them."""
    usage = msg["usage"]
    start = {**msg, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**usage, "output_tokens": 0}}  # fmt: skip
    yield {"type": "message_start", "message": start}
    for i, block in enumerate(msg["content"]):
        first, deltas = _deltas(block)
        yield {"type": "content_block_start", "index": i, "content_block": first}
        for d in deltas:
            yield {"type": "content_block_delta", "index": i, "delta": d}
        yield {"type": "content_block_stop", "index": i}
    yield {
        "type": "message_delta",
        "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": msg["stop_sequence"],
                  "stop_details": None, "container": None},
        "usage": usage,
    }  # fmt: skip
    yield {"type": "message_stop"}
