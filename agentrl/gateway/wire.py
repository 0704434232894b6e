"""What the gateway sends back, whatever the API or transport: answers, their server-sent
events, and error bodies in the format of the client that asked (OpenAI or Anthropic)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agentrl.gateway.openai_api import ApiError, error_body

__all__ = [
    "ROUTES",
    "Answer",
    "anthropic_error",
    "error_answer",
    "looks_anthropic",
    "sse_bytes",
    "sse_stream",
    "unknown_route",
]

ROUTES = (
    "POST chat/completions",
    "POST completions",
    "POST responses",
    "POST messages",
    "GET models",
)
"""The routes of a session, under its base URL ``/sessions/{token}/v1``."""


@dataclass(frozen=True)
class Answer:
    """A response, whatever carries it: a JSON ``body``, or ``stream`` (SSE events).

    ``events``: each streamed item is sent as ``event: {item["type"]}`` with its data,
    and no ``[DONE]`` closes the stream (the Responses and Messages APIs); else each is
    a bare ``data:`` line and ``data: [DONE]`` ends it (chat/completions).
    """

    status: int
    body: Any
    stream: Iterator[dict[str, Any]] | None = None
    events: bool = False


_DONE = b"data: [DONE]\n\n"


def _event(item: Mapping[str, Any], named: bool) -> bytes:
    data = json.dumps(item, ensure_ascii=False)
    if named:
        return f"event: {item['type']}\ndata: {data}\n\n".encode()
    return f"data: {data}\n\n".encode()


def sse_bytes(items: Iterator[dict[str, Any]], *, events: bool = False) -> bytes:
    """``items`` as one server-sent-events body (``[DONE]`` last unless ``events``)."""
    return b"".join([*(_event(i, events) for i in items), b"" if events else _DONE])


def sse_stream(items: Iterator[dict[str, Any]], *, events: bool = False) -> AsyncIterator[bytes]:
    """``items`` as a streamed server-sent-events body."""

    async def gen() -> AsyncIterator[bytes]:
        for item in items:
            yield _event(item, events)
        if not events:
            yield _DONE

    return gen()


_ANTHROPIC_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """The body Anthropic's API answers errors with (the ``anthropic`` client reads it)."""
    kind = _ANTHROPIC_KINDS.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_answer(e: ApiError, *, anthropic: bool = False) -> Answer:
    """``e`` as an answer in the OpenAI format, or Anthropic's."""
    return Answer(e.status, anthropic_error(e.status, e.message) if anthropic else e.body())


def looks_anthropic(path: str, headers: Mapping[str, str]) -> bool:
    """A request from an Anthropic client: its version header, or the Messages route."""
    lower = {k.lower() for k in headers}
    return "anthropic-version" in lower or path.rstrip("/").endswith("/messages")


def unknown_route(method: str, path: str, headers: Mapping[str, str]) -> Answer:
    """The 404 of a route the gateway does not serve, naming the ones it does."""
    served = ", ".join(ROUTES)
    msg = (
        f"the agentrl gateway does not serve {method} {path}; each episode's base URL "
        f"http://HOST:PORT/sessions/{{token}}/v1 serves {served} (an Anthropic client's "
        "base URL is http://HOST:PORT/sessions/{token})"
    )
    if looks_anthropic(path, headers):
        return Answer(404, anthropic_error(404, msg))
    return Answer(404, error_body(msg, status=404, code="unknown_route"))
