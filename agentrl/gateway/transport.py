"""The agent's client talks to its session in process: an HTTP transport without the network.

An agent's client (``openai.AsyncOpenAI``, ``anthropic.AsyncAnthropic``) runs in the
same process and event loop as the gateway, so sending its requests through a
socket, an HTTP parser and a web framework and back costs CPU and buys nothing.
:class:`InProcessTransport` hands each request to a session's routes
(``/sessions/{token}/v1/...``) to :meth:`Gateway.dispatch`, the handler the HTTP
server uses, so the bodies, status codes, events and errors are the same bytes the
server would send. Any other request (another path, another host) goes over real
HTTP to the server, which stays up for clients the agent builds itself from its
client's ``base_url``.

A sync ``solve`` runs in a worker thread with a sync client whose transport
(:func:`in_process_sync_client`) hands its requests to the gateway's event loop
and waits for the answer.

The client's timeout is enforced here (the network layer that would enforce it
is skipped): a request past its ``read`` timeout raises the client library's
``ReadTimeout``, which the SDK raises as its ``APITimeoutError``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib
import json
from typing import TYPE_CHECKING, Any

from agentrl.gateway.wire import Answer, sse_bytes

if TYPE_CHECKING:
    from agentrl.gateway.server import Gateway

__all__ = ["InProcessTransport", "client_httpx", "in_process_client", "in_process_sync_client"]

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream")]


def _sdk(sdk: Any) -> Any:
    if sdk is not None:
        return sdk
    import openai

    return openai


def client_httpx(sdk: Any = None) -> Any:
    """The HTTP library an SDK's client is built on (httpx or httpx2); default ``openai``."""
    base = _sdk(sdk).DefaultAsyncHttpxClient.__mro__[1]  # httpx(2).AsyncClient
    return importlib.import_module(base.__module__.split(".")[0])


def _route(path: str) -> tuple[str, str] | None:
    """(session token, route) of ``/sessions/{token}/v1/{route}``, else None."""
    parts = path.split("/")
    if len(parts) < 5 or parts[1] != "sessions" or parts[3] != "v1" or not parts[2]:
        return None
    return parts[2], "/".join(parts[4:])


class _Local:
    """What the async and sync transports share: which requests are the gateway's, and
    how an answer becomes the client library's response."""

    _httpx: Any = None  # the client library's module, set by the class factories

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._netloc = f"{gateway.host}:{gateway.port}"
        self._fallback: Any = None

    def _local(self, request: Any) -> tuple[str, str] | None:
        route = _route(request.url.path)
        if route is None or request.url.netloc.decode() != self._netloc:
            return None
        return route

    @staticmethod
    def _timeout(request: Any) -> float | None:
        timeout: float | None = (request.extensions.get("timeout") or {}).get("read")
        return timeout

    def _response(self, request: Any, ans: Answer) -> Any:
        if ans.stream is not None:
            content, headers = sse_bytes(ans.stream, events=ans.events), _SSE
        else:
            content = json.dumps(ans.body, ensure_ascii=False, separators=(",", ":")).encode()
            headers = _JSON
        return self._httpx.Response(ans.status, headers=headers, content=content, request=request)

    def _dispatch(self, request: Any, route: tuple[str, str], raw: bytes) -> Any:
        token, name = route
        return self.gateway.dispatch(
            request.method, token, name, raw, request.headers, path=request.url.path
        )


@functools.cache
def _async_class(httpx: Any) -> type:
    class InProcessTransport(_Local, httpx.AsyncBaseTransport):
        """An async HTTP transport answering a gateway's session routes in process."""

        _httpx = httpx

        async def handle_async_request(self, request: Any) -> Any:
            route = self._local(request)
            if route is None:
                if self._fallback is None:
                    self._fallback = self._httpx.AsyncHTTPTransport()
                return await self._fallback.handle_async_request(request)
            raw = await request.aread()
            timeout = self._timeout(request)
            try:
                async with asyncio.timeout(timeout):
                    ans = await self._dispatch(request, route, raw)
            except TimeoutError as e:
                raise self._httpx.ReadTimeout(
                    f"the gateway did not answer within {timeout}s", request=request
                ) from e
            return self._response(request, ans)

        async def aclose(self) -> None:
            """Closes the HTTP fallback's connections; idempotent."""
            if self._fallback is not None:
                fallback, self._fallback = self._fallback, None
                await fallback.aclose()

    return InProcessTransport


@functools.cache
def _sync_class(httpx: Any) -> type:
    class SyncInProcessTransport(_Local, httpx.BaseTransport):
        """A sync HTTP transport (for a worker thread) answering a gateway's session
        routes on the gateway's event loop."""

        _httpx = httpx

        def __init__(self, gateway: Gateway, loop: asyncio.AbstractEventLoop) -> None:
            super().__init__(gateway)
            self.loop = loop

        def handle_request(self, request: Any) -> Any:
            route = self._local(request)
            if route is None:
                if self._fallback is None:
                    self._fallback = self._httpx.HTTPTransport()
                return self._fallback.handle_request(request)
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self.loop:
                raise RuntimeError(
                    "a sync client was used on the gateway's event loop (it would wait for "
                    "itself): use the async client there; a sync solve runs in a thread"
                )
            timeout = self._timeout(request)
            fut = asyncio.run_coroutine_threadsafe(
                self._dispatch(request, route, request.read()), self.loop
            )
            try:
                ans = fut.result(timeout)
            except concurrent.futures.TimeoutError as e:
                fut.cancel()
                raise self._httpx.ReadTimeout(
                    f"the gateway did not answer within {timeout}s", request=request
                ) from e
            return self._response(request, ans)

        def close(self) -> None:
            if self._fallback is not None:
                fallback, self._fallback = self._fallback, None
                fallback.close()

    return SyncInProcessTransport


InProcessTransport = _async_class(client_httpx())
"""The in-process transport of ``openai`` clients: ``InProcessTransport(gateway)``."""


def in_process_client(gateway: Gateway, *, sdk: Any = None, **kwargs: Any) -> Any:
    """An SDK's ``DefaultAsyncHttpxClient`` (``openai``'s by default, or pass the
    ``anthropic`` module) whose session requests never leave the process."""
    transport = _async_class(client_httpx(sdk))(gateway)
    return _sdk(sdk).DefaultAsyncHttpxClient(transport=transport, **kwargs)


def in_process_sync_client(
    gateway: Gateway, loop: asyncio.AbstractEventLoop, *, sdk: Any = None, **kwargs: Any
) -> Any:
    """An SDK's sync ``DefaultHttpxClient``, for a worker thread, whose session requests
    are answered on ``loop`` (the gateway's) without a socket."""
    transport = _sync_class(client_httpx(sdk))(gateway, loop)
    return _sdk(sdk).DefaultHttpxClient(transport=transport, **kwargs)
