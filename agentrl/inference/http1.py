"""A lean HTTP/1.1 keep-alive client for JSON POSTs to one server.

The rollout path sends one small POST per model turn to the same few servers, a
thousand at a time. General clients pay for what this path never uses (cookies,
redirects, header multidicts, tracing hooks, per-request objects): aiohttp cost
~0.3 ms of CPU per request here, as much as the rest of a turn
(``benchmarks/rollout_overhead.py``). This client keeps only what the path needs:
a pool of idle connections (most recent first), one bytes buffer per request,
and the response parsed by ``httptools`` (llhttp, the parser uvicorn uses).
Responses must carry ``Content-Length`` or chunked encoding, as every HTTP/1.1
server does for these endpoints; a body ended by closing the connection is
reported as :class:`RequestFailed`.

Failures are reported by where they happened, because that decides whether a
resend is safe:

* :class:`ConnectFailed`: no connection could be made; nothing was sent.
* :class:`RequestFailed`: the request was (or may have been) sent, and the
  connection broke or sent garbage before a whole response arrived.
* ``TimeoutError``: the request's deadline passed (pool wait, connect, send and
  read all count against it).

A pooled connection the server closed while it sat idle (keep-alive timeout) is
noticed when it is taken, or, if its close crosses the request, by the
connection ending before one response byte arrived; that request is sent again
once on a new connection, as browsers and urllib3 do.

Example:
    >>> async def main():  # doctest: +SKIP
    ...     async with Http1Pool("http://127.0.0.1:8000") as pool:
    ...         status, body = await pool.post("/v1/completions", b"{}", timeout_s=10)
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

from agentrl.runtime.lifecycle import AsyncClosing

__all__ = ["ConnectFailed", "Http1Pool", "HttpError", "RequestFailed"]


class HttpError(Exception):
    """A request did not get a whole HTTP response."""


class ConnectFailed(HttpError):
    """No connection could be made; the request was not sent."""


class RequestFailed(HttpError):
    """The connection failed after the request was (or may have been) sent."""


class _Stale(RequestFailed):
    """A reused connection ended before one byte of the response arrived."""


class _Conn(asyncio.Protocol):
    """One connection; carries at most one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.chunks: list[bytes] = []
        self.got_bytes = False
        self.reused = False
        self.keep_alive = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (a cast, not an isinstance check: uvloop's transports, which Ray's async actors
        # run on, do not subclass asyncio.Transport)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        if self.waiter is None:  # bytes nobody asked for: the connection is unusable
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(RequestFailed("server switched protocols"))
        except httptools.HttpParserError as e:
            self._fail(RequestFailed(f"malformed HTTP response: {e}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            cls = _Stale if self.reused and not self.got_bytes else RequestFailed
            self.waiter.set_exception(cls(f"connection closed by the server ({exc or 'EOF'})"))

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        # (read here: the parser forgets it once the callback returns)
        self.keep_alive = self.parser.should_keep_alive()
        w = self.waiter
        if w is not None and not w.done():
            w.set_result((self.parser.get_status_code(), b"".join(self.chunks)))

    # ours
    def send(self, data: bytes) -> asyncio.Future[tuple[int, bytes]]:
        """Writes one request; the future resolves to (status, body)."""
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.chunks, self.got_bytes, self.keep_alive = [], False, False
        self.transport.write(data)
        return self.waiter

    def done(self) -> bool:
        """After a response: True if the connection can carry another request."""
        self.waiter = None
        return not self.closed and self.keep_alive

    def _fail(self, e: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(e)
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Http1Pool(AsyncClosing):
    """Keep-alive HTTP/1.1 connections to one server, for POSTs of JSON bodies.

    Args:
        base_url: ``http://host:port[/prefix]`` or ``https://...``.
        max_connections: Connections open at once; requests beyond wait for one.
        connect_timeout_s: Seconds to establish one connection.
        headers: Extra headers sent with every request (e.g. ``Authorization``).
        ssl_context: TLS settings for ``https`` (None: the system's trusted CAs).
    """

    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int = 4096,
        connect_timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"{base_url!r}: expected http://host[:port] or https://host[:port]")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.ssl: ssl.SSLContext | None = None
        if u.scheme == "https":
            self.ssl = ssl_context or ssl.create_default_context()
        self.connect_timeout_s = connect_timeout_s
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f"Host: {u.netloc}\r\nContent-Type: application/json\r\n{extra}"
        self._idle: list[_Conn] = []
        self._open: set[_Conn] = set()  # every connection made and not yet dropped
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False

    async def post(self, path: str, body: bytes, *, timeout_s: float) -> tuple[int, bytes]:
        """POSTs ``body`` (JSON) to ``path``; returns (status, response body).

        Raises:
            ConnectFailed: No connection could be made (nothing was sent).
            RequestFailed: The connection failed after the request was sent.
            TimeoutError: ``timeout_s`` passed before the whole response arrived.
        """
        data = (
            f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        async with asyncio.timeout(timeout_s), self._slots:
            try:
                return await self._send(data)
            except _Stale:  # the server closed it while idle: resend once, fresh
                return await self._send(data, fresh=True)

    async def _send(self, data: bytes, *, fresh: bool = False) -> tuple[int, bytes]:
        conn = await self._connection(fresh)
        try:
            status, body = await conn.send(data)
        except BaseException:  # failed or cancelled mid-request: its state is unknown
            self._drop(conn)
            raise
        if conn.done() and not self._closed:
            conn.reused = True
            self._idle.append(conn)
        else:
            self._drop(conn)
        return status, body

    def _drop(self, conn: _Conn) -> None:
        conn.abort()
        self._open.discard(conn)

    async def _connection(self, fresh: bool) -> _Conn:
        if self._closed:
            raise ConnectFailed("the HTTP pool is closed")
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
            self._open.discard(conn)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(_Conn, self.host, self.port, ssl=self.ssl)
        except TimeoutError as e:
            raise ConnectFailed(f"no connection within {self.connect_timeout_s:g} s") from e
        except OSError as e:
            why = str(e) or repr(e)
            if e.errno and not isinstance(e, ssl.SSLError):  # (TLS errors reuse errno 1)
                why = os.strerror(e.errno)
            raise ConnectFailed(f"{self.host}:{self.port}: {why}") from e
        if self._closed:  # closed while connecting
            conn.abort()
            raise ConnectFailed("the HTTP pool is closed")
        self._open.add(conn)
        return conn

    async def close(self) -> None:
        """Closes every connection, in-flight requests' too; later ones fail (idempotent)."""
        self._closed = True
        conns, self._open, self._idle = self._open, set(), []
        for conn in conns:
            conn.abort()
