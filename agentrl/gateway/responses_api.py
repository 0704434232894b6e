"""OpenAI's Responses API (``POST /v1/responses``) over a session's exact-token chat record.

A request becomes a chat request (``instructions`` a system message, ``input`` items
messages; a ``function_call`` item a tool call of the assistant message before it, a
``function_call_output`` item a tool message), is answered by :meth:`Session.chat`
exactly as ``/v1/chat/completions`` is (the same record, tokens, logprobs and weight
versions), and the reply becomes ``message`` and ``function_call`` output items.

``previous_response_id`` continues a response of the same session: the gateway keeps
each response's conversation (input and output, not its instructions, as OpenAI
does) by id, until the episode ends. What would change the sampling distribution in
a way the recorded logprobs could not describe (structured output, ``top_logprobs``)
and what needs OpenAI's servers (hosted tools, ``conversation``, stored ``prompt``,
``background``) is refused with a 400 naming it.
"""

from __future__ import annotations

import itertools
import json
import time
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

__all__ = ["ResponsesRequest", "parse_responses_request", "response_body", "response_events"]

_KEYS = {
    "input", "instructions", "tools", "tool_choice", "stream", "temperature", "top_p",
    "max_output_tokens", "previous_response_id", "include", "text", "top_logprobs",
    "background", "conversation", "prompt",
}  # fmt: skip
# Accepted and ignored: they do not change what is sampled.
_IGNORED = {
    "model", "user", "store", "metadata", "parallel_tool_calls", "service_tier", "truncation",
    "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options", "safety_identifier",
    "reasoning", "stream_options", "max_tool_calls", "context_management",
}  # fmt: skip
_TEXT_PARTS = ("input_text", "output_text", "text")
_LOGPROBS = "message.output_text.logprobs"


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated Responses request: the chat request it becomes, and what its answer
    echoes. ``history``: its conversation without the instructions (kept by id)."""

    chat: ChatRequest
    history: list[Message]
    echo: dict[str, Any]
    stream: bool = False
    logprobs: bool = False
    store: bool = True


def _bad(message: str, param: str = "input") -> ApiError:
    return ApiError(400, message, param=param)


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}: content must be a string or a list of parts")
    out = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind == "refusal":
            out.append(str(part.get("refusal", "")))
        elif kind in _TEXT_PARTS:
            out.append(str(part.get("text", "")))
        else:
            raise _bad(f"{where}: only text content parts are supported, got {kind!r}")
    return "".join(out)


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        args = json.loads(raw) if raw else {}
    except (TypeError, json.JSONDecodeError) as e:
        raise _bad(f"{where}: arguments are not JSON ({e})") from e
    if not isinstance(args, dict):
        raise _bad(f"{where}: arguments must be a JSON object")
    return args


def _items(raw: Any) -> list[Message]:
    """``input`` (a string or a list of items) as chat messages."""
    if isinstance(raw, str):
        return [Message.user(raw)]
    if not isinstance(raw, list):
        raise _bad("'input' must be a string or a list of items")
    out: list[Message] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _bad(f"{where}: role must be user, system, developer or assistant")
            text = _text(item.get("content", ""), where)
            out.append(Message("system" if role == "developer" else role, text))
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not item.get("call_id"):
                raise _bad(f"{where}: a function_call needs name and call_id")
            call = ToolCall(item["name"], _arguments(item.get("arguments"), where),
                            str(item["call_id"]))  # fmt: skip
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":  # the reply it came with
                out[-1] = Message("assistant", last.content, (*last.tool_calls, call))
            else:
                out.append(Message("assistant", "", (call,)))
        elif kind == "function_call_output":
            if not item.get("call_id"):
                raise _bad(f"{where}: a function_call_output needs call_id")
            output = item.get("output", "")
            text = output if isinstance(output, str) else _text(output, where)
            out.append(Message.tool(text, tool_call_id=str(item["call_id"])))
        elif kind == "reasoning":
            continue  # the record keeps the reasoning the model sampled
        else:
            raise _bad(
                f"{where}: input items of type {kind!r} are not supported (message, "
                "function_call, function_call_output and reasoning are)"
            )
    return out


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad("'tools' must be a list", "tools")
    out = []
    for t in raw:
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function" or not isinstance(t.get("name"), str):
            raise ApiError(
                400, f"tools of type {kind!r} are not supported: only function tools "
                "({type: function, name, parameters}) are", param="tools",
                code="unsupported_parameter",
            )  # fmt: skip
        fn = {"name": t["name"], "parameters": t.get("parameters") or {"type": "object"}}
        if t.get("description"):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _choice(raw: Any, tools: list[dict[str, Any]]) -> tuple[str, str | None]:
    if raw is None or raw in ("auto", "none", "required"):
        choice, name = raw or "auto", None
    elif isinstance(raw, dict) and raw.get("type") == "function":
        choice, name = "required", raw.get("name")
    else:
        raise ApiError(
            400, f"tool_choice {raw!r} is not supported: use auto, none, required or "
            '{"type": "function", "name": ...}', param="tool_choice",
            code="unsupported_parameter",
        )  # fmt: skip
    check_tool_choice(choice, name, [t["function"]["name"] for t in tools])
    return choice, name


def _refuse(body: Mapping[str, Any]) -> None:
    for key in body:
        if key not in _KEYS and key not in _IGNORED:
            raise ApiError(
                400, f"unsupported parameter '{key}' for /v1/responses (the agentrl gateway "
                f"accepts: {', '.join(sorted(_KEYS))})", param=key, code="unsupported_parameter",
            )  # fmt: skip
    why = {
        "background": "responses run in the episode, not in the background",
        "conversation": "use previous_response_id (the session keeps its responses)",
        "prompt": "stored prompts live on OpenAI's servers",
        "top_logprobs": "the sampled token's logprob is always recorded; include "
        f"'{_LOGPROBS}' to get it",
    }
    for key, reason in why.items():
        if body.get(key):
            raise ApiError(400, f"'{key}' is not supported: {reason}", param=key,
                           code="unsupported_parameter")  # fmt: skip
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if fmt and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise ApiError(400, "text.format other than text is not supported", param="text",
                       code="unsupported_parameter")  # fmt: skip


def parse_responses_request(body: Any, stored: Mapping[str, list[Message]]) -> ResponsesRequest:
    """Validates a Responses request; ``stored``: the session's conversations by response id.

    Raises:
        ApiError: 400 naming what is malformed or unsupported; 404 for an unknown
            ``previous_response_id``.
    """
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    _refuse(body)
    prev_id = body.get("previous_response_id")
    history: list[Message] = []
    if prev_id is not None:
        if prev_id not in stored:
            raise ApiError(
                404, f"previous response {prev_id!r} not found in this session (responses "
                "are kept per episode, unless created with store=false)",
                param="previous_response_id", code="previous_response_not_found",
            )  # fmt: skip
        history = list(stored[prev_id])
    history += _items(body.get("input", []))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("'instructions' must be a string", "instructions")
    messages = [Message.system(instructions), *history] if instructions else list(history)
    if not messages:
        raise _bad("'input' must not be empty")
    tools = _tools(body.get("tools"))
    choice, name = _choice(body.get("tool_choice"), tools)
    sampling = Sampling(
        temperature=number_field(body, "temperature", 0.0, 2.0),
        top_p=number_field(body, "top_p", 0.0, 1.0),
        max_tokens=int_field(body, "max_output_tokens", 1),
    )
    include = body.get("include") or []
    chat = ChatRequest(
        messages=messages, raw_messages=[chat_dict(m) for m in messages], tools=tools,
        tool_choice=choice, tool_name=name, sampling=sampling,
    )  # fmt: skip
    echo = {
        "instructions": instructions,
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": prev_id,
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
    }
    return ResponsesRequest(
        chat=chat, history=history, echo=echo, stream=bool(body.get("stream")),
        logprobs=isinstance(include, list) and _LOGPROBS in include,
        store=body.get("store") is not False,
    )  # fmt: skip


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _output(r: Reply, logprobs: bool) -> list[dict[str, Any]]:
    status = "incomplete" if r.finish_reason == "length" else "completed"
    out: list[dict[str, Any]] = []
    if r.reasoning:
        out.append({
            "type": "reasoning", "id": _id("rs"), "summary": [], "status": "completed",
            "content": [{"type": "reasoning_text", "text": r.reasoning}],
        })  # fmt: skip
    if r.content or not r.tool_calls:
        lps = [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(r.tokens, r.logprobs, strict=True)
        ]
        part = {"type": "output_text", "text": r.content, "annotations": [],
                "logprobs": lps if logprobs else []}  # fmt: skip
        out.append({"type": "message", "id": _id("msg"), "role": "assistant",
                    "status": status, "content": [part]})  # fmt: skip
    for c in r.tool_calls:
        out.append({
            "type": "function_call", "id": _id("fc"), "call_id": c.id, "name": c.name,
            "arguments": json.dumps(c.arguments, ensure_ascii=False), "status": "completed",
        })  # fmt: skip
    return out


def response_body(r: Reply, req: ResponsesRequest) -> dict[str, Any]:
    """The ``response`` object of a reply (status ``incomplete`` when cut by length)."""
    now = time.time()
    incomplete = r.finish_reason == "length"
    return {
        "id": _id("resp"), "object": "response", "created_at": now, "completed_at": now,
        "status": "incomplete" if incomplete else "completed", "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "model": r.model, "output": _output(r, req.logprobs), **req.echo,
        "text": {"format": {"type": "text"}}, "truncation": "disabled",
        "store": req.store, "background": False,
        "usage": {
            "input_tokens": r.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": r.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": r.prompt_tokens + r.completion_tokens,
        },
    }  # fmt: skip


def response_events(resp: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The server-sent events of a streamed response, in the order OpenAI sends them."""
    seq = itertools.count()

    def ev(kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "sequence_number": next(seq), **fields}

    shell = {**resp, "status": "in_progress", "output": [], "usage": None,
             "incomplete_details": None, "completed_at": None}  # fmt: skip
    yield ev("response.created", response=shell)
    yield ev("response.in_progress", response=shell)
    for i, item in enumerate(resp["output"]):
        at = {"item_id": item["id"], "output_index": i}
        if item["type"] == "message":
            yield ev("response.output_item.added", output_index=i,
                     item={**item, "status": "in_progress", "content": []})  # fmt: skip
            for j, part in enumerate(item["content"]):
                yield ev("response.content_part.added", **at, content_index=j,
                         part={**part, "text": "", "logprobs": []})  # fmt: skip
                yield ev("response.output_text.delta", **at, content_index=j,
                         delta=part["text"], logprobs=part["logprobs"])  # fmt: skip
                yield ev("response.output_text.done", **at, content_index=j,
                         text=part["text"], logprobs=part["logprobs"])  # fmt: skip
                yield ev("response.content_part.done", **at, content_index=j, part=part)
        elif item["type"] == "function_call":
            yield ev("response.output_item.added", output_index=i,
                     item={**item, "arguments": "", "status": "in_progress"})  # fmt: skip
            yield ev("response.function_call_arguments.delta", **at, delta=item["arguments"])
            yield ev("response.function_call_arguments.done", **at, name=item["name"],
                     arguments=item["arguments"])  # fmt: skip
        else:
            yield ev("response.output_item.added", output_index=i, item=item)
        yield ev("response.output_item.done", output_index=i, item=item)
    done = "response.incomplete" if resp["status"] == "incomplete" else "response.completed"
    yield ev(done, response=resp)
