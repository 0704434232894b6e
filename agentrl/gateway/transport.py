"""The agent's client talks to its session in process: an HTTP transport without the network.

An agent's ``openai.AsyncOpenAI`` client runs in the same process and event loop
as the gateway, so sending its requests through a socket, an HTTP parser and a
web framework and back costs CPU and buys nothing. :class:`InProcessTransport`
hands each request of a session's routes (``POST chat/completions``,
``POST completions``, ``GET models``) to :meth:`Gateway.answer`, the handler the
HTTP server uses, so the bodies, status codes and errors are the same bytes the
server would send. Any other request (another route, another host) goes over
real HTTP to the server, which stays up for clients the agent builds itself
from ``client.base_url``.

The client's timeout is enforced here (the network layer that would enforce it
is skipped): a request past its ``read`` timeout raises the client library's
``ReadTimeout``, which the ``openai`` client raises as ``APITimeoutError``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from typing import TYPE_CHECKING, Any

from agentrl.gateway.server import sse_bytes

if TYPE_CHECKING:
    from agentrl.gateway.server import Gateway

__all__ = ["InProcessTransport", "client_httpx", "in_process_client"]

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream")]


def client_httpx() -> Any:
    """The HTTP library the installed ``openai`` client is built on (httpx or httpx2)."""
    import openai

    base = openai.DefaultAsyncHttpxClient.__mro__[1]  # httpx(2).AsyncClient
    return importlib.import_module(base.__module__.split(".")[0])


def _route(path: str) -> tuple[str, str] | None:
    """(session token, route) of ``/sessions/{token}/v1/{route}``, else None."""
    parts = path.split("/")
    if len(parts) < 5 or parts[1] != "sessions" or parts[3] != "v1" or not parts[2]:
        return None
    return parts[2], "/".join(parts[4:])


def in_process_client(gateway: Gateway, **kwargs: Any) -> Any:
    """An ``openai.DefaultAsyncHttpxClient`` whose session requests never leave the process."""
    import openai

    return openai.DefaultAsyncHttpxClient(transport=InProcessTransport(gateway), **kwargs)


def _base() -> type:
    base: type = client_httpx().AsyncBaseTransport
    return base


class InProcessTransport(_base()):  # type: ignore[misc]
    """An async HTTP transport (httpx API) answering a gateway's session routes in process.

    Args:
        gateway: The started :class:`Gateway` whose sessions the requests address.
    """

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._httpx = client_httpx()
        self._netloc = f"{gateway.host}:{gateway.port}"
        self._fallback: Any = None

    async def handle_async_request(self, request: Any) -> Any:
        """Answers ``request`` in process, or over HTTP when it is not a session route."""
        route = _route(request.url.path)
        local = route is not None and request.url.netloc.decode() == self._netloc
        if local and route is not None:
            token, name = route
            if request.method == "GET" and name == "models":
                ans = self.gateway.models(token)
                return self._response(request, ans.status, ans.body, None)
            if request.method == "POST" and name in ("chat/completions", "completions"):
                raw = await request.aread()
                timeout = (request.extensions.get("timeout") or {}).get("read")
                try:
                    async with asyncio.timeout(timeout):
                        ans = await self.gateway.answer(token, raw, chat=name == "chat/completions")
                except TimeoutError as e:
                    raise self._httpx.ReadTimeout(
                        f"the gateway did not answer within {timeout}s", request=request
                    ) from e
                return self._response(request, ans.status, ans.body, ans.stream)
        if self._fallback is None:
            self._fallback = self._httpx.AsyncHTTPTransport()
        return await self._fallback.handle_async_request(request)

    def _response(self, request: Any, status: int, body: Any, stream: Any) -> Any:
        if stream is not None:
            content, headers = sse_bytes(stream), _SSE
        else:
            content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
            headers = _JSON
        return self._httpx.Response(status, headers=headers, content=content, request=request)

    async def aclose(self) -> None:
        """Closes the HTTP fallback's connections; idempotent."""
        if self._fallback is not None:
            fallback, self._fallback = self._fallback, None
            await fallback.aclose()
