"""A real HTTP server on 127.0.0.1 for client tests: scripted answers, recorded requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Seen:
    path: str
    body: dict[str, Any] = field(default_factory=dict)


def reply(status: int, body: Any) -> web.Response:
    if isinstance(body, str):
        return web.Response(status=status, text=body)
    return web.json_response(body, status=status)


class FakeServer:
    """A real HTTP server on 127.0.0.1; ``handler(seen, n)`` answers the n-th POST.

    The handler returns an aiohttp response (or a coroutine of one), or ``"drop"`` to
    close the connection mid-request. :meth:`stop` closes the listening socket and
    every open connection, so later requests are refused.
    """

    def __init__(self, handler: Callable[[Seen, int], Any]) -> None:
        self.handler = handler
        self.seen: list[Seen] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _post(self, request: web.Request) -> web.StreamResponse:
        s = Seen(request.path, json.loads(await request.read()))
        self.seen.append(s)
        out = self.handler(s, len(self.seen))
        if asyncio.iscoroutine(out):
            out = await out
        if isinstance(out, str) and out == "drop":
            assert request.transport is not None
            request.transport.close()
            await asyncio.sleep(1)
        assert isinstance(out, web.StreamResponse)
        return out

    async def start(self) -> FakeServer:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._post)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        """Closes the server (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


@asynccontextmanager
async def fake_server(
    handler: Callable[[Seen, int], Any],
) -> AsyncIterator[tuple[str, list[Seen]]]:
    """A :class:`FakeServer` for the duration of the block: yields (url, requests seen)."""
    srv = await FakeServer(handler).start()
    try:
        yield srv.url, srv.seen
    finally:
        await srv.stop()
