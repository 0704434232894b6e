"""OpenAI wire format, requests: validation and error bodies.

Only what the gateway honours is accepted. A parameter that would change the
sampling distribution in a way the recorded logprobs could not describe
(penalties, logit bias, several choices, structured output) is refused with an
OpenAI-style 400 naming it, so the agent's ``openai`` client raises
``BadRequestError`` instead of silently getting something else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.types import Message

__all__ = [
    "ApiError",
    "ChatRequest",
    "CompletionRequest",
    "Sampling",
    "chat_dict",
    "check_tool_choice",
    "error_body",
    "int_field",
    "number_field",
    "parse_chat_request",
    "parse_completion_request",
]

# Accepted and ignored: they do not change what is sampled.
_IGNORED = {
    "model",
    "user",
    "store",
    "metadata",
    "parallel_tool_calls",
    "service_tier",
    "stream_options",
    "prompt_cache_key",
    "safety_identifier",
    "echo",
    "suffix",
    "best_of",
}
_SAMPLING = {"temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "stop"}
_CHAT_KEYS = _SAMPLING | {
    "messages",
    "tools",
    "tool_choice",
    "stream",
    "logprobs",
    "top_logprobs",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "response_format",
}
_COMPLETION_KEYS = _SAMPLING | {
    "prompt",
    "stream",
    "logprobs",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
}


class ApiError(Exception):
    """An error the gateway answers with an OpenAI-style body.

    Args:
        status: HTTP status (4xx: the request; 5xx: the inference side).
        message: What is wrong, for the agent's developer.
        param: The offending request field, if one.
        code: A short machine-readable code.
    """

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, status=self.status, param=self.param, code=self.code)


def error_body(
    message: str, *, status: int = 400, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The JSON body OpenAI answers errors with (the ``openai`` client reads ``error``)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 404:
        kind = "not_found_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class Sampling:
    """Sampling fields of a request, before the run's limits apply (None: not sent)."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChatRequest:
    """A validated ``POST /v1/chat/completions`` body (also what a Responses or Messages
    API request becomes). ``tool_choice``: auto, none or required; ``tool_name``: the
    function a named choice forces (then ``tool_choice`` is required)."""

    messages: list[Message]
    raw_messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_choice: str = "auto"
    tool_name: str | None = None
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    sampling: Sampling = field(default_factory=Sampling)


@dataclass(frozen=True)
class CompletionRequest:
    """A validated ``POST /v1/completions`` body; ``prompt`` is text or token ids."""

    prompt: str | list[int]
    stream: bool = False
    logprobs: bool = False
    sampling: Sampling = field(default_factory=Sampling)


def number_field(body: Mapping[str, Any], key: str, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise ApiError(400, f"'{key}' must be a number in [{lo}, {hi}], got {v!r}", param=key)
    return float(v)


def int_field(body: Mapping[str, Any], key: str, lo: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ApiError(400, f"'{key}' must be an integer ≥ {lo}, got {v!r}", param=key)
    return int(v)


def _check_keys(body: Mapping[str, Any], allowed: set[str], route: str) -> None:
    for key in body:
        if key not in allowed and key not in _IGNORED:
            raise ApiError(
                400,
                f"unsupported parameter '{key}' for {route} (the agentrl gateway accepts: "
                f"{', '.join(sorted(allowed))})",
                param=key,
                code="unsupported_parameter",
            )
    if (int_field(body, "n", 1) or 1) != 1:
        raise ApiError(400, "'n' must be 1 (one choice per request)", param="n")
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key):
            raise ApiError(
                400,
                f"'{key}' is not supported: it changes the sampling distribution",
                param=key,
                code="unsupported_parameter",
            )
    if body.get("logit_bias"):
        raise ApiError(
            400, "'logit_bias' is not supported", param="logit_bias", code="unsupported_parameter"
        )


def _sampling(body: Mapping[str, Any]) -> Sampling:
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) and s for s in stop) and len(stop) <= 4:
        stops = tuple(stop)
    else:
        raise ApiError(400, "'stop' must be a string or up to 4 non-empty strings", param="stop")
    max_tokens = int_field(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = int_field(body, "max_tokens", 1)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ApiError(400, f"'seed' must be an integer, got {seed!r}", param="seed")
    return Sampling(
        temperature=number_field(body, "temperature", 0.0, 2.0),
        top_p=number_field(body, "top_p", 0.0, 1.0),
        max_tokens=max_tokens,
        seed=seed,
        stop=stops,
    )


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ApiError(
                    400, f"{where}: only text content parts are supported, got {kind!r}",
                    param="messages",
                )  # fmt: skip
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ApiError(400, f"{where}: content must be a string or a list of parts", param="messages")


def _message(d: Any, i: int) -> Message:
    where = f"messages[{i}]"
    if not isinstance(d, dict) or d.get("role") not in (
        "system",
        "developer",
        "user",
        "assistant",
        "tool",
    ):
        raise ApiError(
            400,
            f"{where} must be an object with role system, developer, user, assistant or tool",
            param="messages",
        )
    d = dict(d)
    d["content"] = _text_of(d.get("content"), where)
    if d["role"] == "developer":
        d["role"] = "system"
    try:
        return Message.from_dict(d)
    except (KeyError, TypeError, ValueError) as e:  # bad tool_calls / arguments JSON
        raise ApiError(400, f"{where}: malformed tool_calls ({e})", param="messages") from e


def check_tool_choice(choice: str, name: str | None, tools: list[Any]) -> None:
    """A forced ``choice`` ("required", or a function ``name``) needs tools (that one)."""
    if choice != "required":
        return
    if not tools:
        raise ApiError(400, "tool_choice forces a tool call, but no tools were given",
                       param="tool_choice")  # fmt: skip
    if name is not None and name not in tools:
        raise ApiError(
            400, f"tool_choice names function {name!r}, which is not among the tools "
            f"({', '.join(map(str, tools))})", param="tool_choice",
        )  # fmt: skip


def parse_chat_request(body: Any) -> ChatRequest:
    """Validates a chat request body.

    Raises:
        ApiError: 400 naming the field that is missing, malformed or unsupported.
    """
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    _check_keys(body, _CHAT_KEYS, "/v1/chat/completions")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    messages = [_message(d, i) for i, d in enumerate(raw)]
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and t.get("type", "function") == "function" and "function" in t
        for t in tools
    ):
        raise ApiError(
            400, "'tools' must be a list of {type: function, function: {...}}", param="tools"
        )
    choice = body.get("tool_choice") or "auto"
    name = None
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        choice = "required"
    elif choice not in ("auto", "none", "required"):
        raise ApiError(
            400,
            f"tool_choice {choice!r} is not supported: use auto, none, required or "
            '{"type": "function", "function": {"name": ...}}',
            param="tool_choice",
            code="unsupported_parameter",
        )
    check_tool_choice(choice, name, [t["function"].get("name") for t in tools])
    fmt = body.get("response_format")
    if fmt and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise ApiError(
            400, "response_format other than text is not supported", param="response_format",
            code="unsupported_parameter",
        )  # fmt: skip
    if body.get("top_logprobs"):
        raise ApiError(
            400, "top_logprobs is not supported (the sampled token's logprob is always "
            "recorded; ask for logprobs=true)", param="top_logprobs", code="unsupported_parameter",
        )  # fmt: skip
    options = body.get("stream_options") or {}
    return ChatRequest(
        messages=messages,
        raw_messages=[dict(d) for d in raw],
        tools=[dict(t) for t in tools],
        tool_choice=choice,
        tool_name=name,
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        logprobs=bool(body.get("logprobs")),
        sampling=_sampling(body),
    )


def parse_completion_request(body: Any) -> CompletionRequest:
    """Validates a text-completion request body (``prompt``: a string or token ids)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    _check_keys(body, _COMPLETION_KEYS, "/v1/completions")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    ok_ids = isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    )
    if not (isinstance(prompt, str) and prompt) and not (ok_ids and prompt):
        raise ApiError(
            400, "'prompt' must be one non-empty string or token-id list", param="prompt"
        )
    return CompletionRequest(
        prompt=prompt,
        stream=bool(body.get("stream")),
        logprobs=body.get("logprobs") is not None and body.get("logprobs") is not False,
        sampling=_sampling(body),
    )


def chat_dict(m: Message) -> dict[str, Any]:
    """``m`` as an OpenAI chat message dict (what a scorer is given), arguments as JSON."""
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        d["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for c in m.tool_calls
        ]  # fmt: skip
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    return d
