"""Serving the inspector: bind the port (a clear error when it is taken), run, stop on Ctrl-C."""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs

import uvicorn
from fastapi import FastAPI

from agentrl.runtime.doors import is_loopback, same_secret, secret_digest, send_unauthorized

__all__ = [
    "TOKEN_ENV",
    "ServeError",
    "TokenGate",
    "bind",
    "check_host",
    "is_loopback",
    "serve",
]

TOKEN_ENV = "AGENTRL_INSPECTOR_TOKEN"
"""Environment variable read for ``--token``."""
COOKIE = "agentrl_inspector_token"


class ServeError(OSError):
    """The inspector cannot listen where it was asked to (the message says why)."""


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (port 0: a free one).

    Raises:
        ServeError: The port is in use, the host unknown, or binding not allowed.
    """
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ServeError(f"cannot listen on {host!r}: unknown host ({e.strerror})") from None
    sock = socket.socket(family, kind, proto)
    try:
        # Lets a restart reuse a port in TIME_WAIT; a port someone listens on stays taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ServeError(
                f"port {port} on {host} is already in use: pick another with --port "
                "(--port 0 takes a free one)"
            ) from None
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    return sock


def check_host(host: str, token: str | None) -> None:
    """Refuses a non-loopback ``host`` without a token: the page shows the whole run.

    Raises:
        ServeError: ``host`` is reachable from other machines and no token was given.
    """
    if not token and not is_loopback(host):
        raise ServeError(
            f"--host {host} would show this run to anyone who can reach this machine: give "
            f"--token SECRET (or set {TOKEN_ENV}) to require it on every request, or listen "
            "on 127.0.0.1 (the default)"
        )


class TokenGate:
    """ASGI middleware: every request needs the token, else 401.

    The token is read from ``Authorization: Bearer``, the ``token`` query parameter
    (a browser's first visit: the answer then sets an HttpOnly, SameSite=Strict cookie
    so the page's own requests carry it) or that cookie; compared in constant time.
    """

    def __init__(self, app: Any, token: str) -> None:
        if not token:
            raise ValueError("TokenGate needs a non-empty token")
        self.app = app
        self._digest = secret_digest(token)

    def _given(self, scope: dict[str, Any]) -> tuple[str, bool]:
        """(token offered, whether it came in the query)."""
        headers = {k.lower(): v.decode("latin-1") for k, v in scope.get("headers") or ()}
        scheme, _, bearer = headers.get(b"authorization", "").partition(" ")
        if scheme.lower() == "bearer" and bearer:
            return bearer.strip(), False
        query = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token")
        if query:
            return query[0], True
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get(b"cookie", ""))
        except Exception:  # a malformed Cookie header is no token
            return "", False
        morsel = cookie.get(COOKIE)
        return (morsel.value if morsel else ""), False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        token, from_query = self._given(scope)
        if not same_secret(token, self._digest):
            body = b"401: this inspector needs its token (open the page once with ?token=...)"
            await send_unauthorized(send, body, b"text/plain; charset=utf-8")
            return
        if not from_query:
            await self.app(scope, receive, send)
            return
        cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict".encode("latin-1")

        async def send_with_cookie(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (b"set-cookie", cookie)],
                }
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def serve(app: FastAPI, sock: socket.socket, on_stop: Callable[[], None] | None = None) -> None:
    """Serves ``app`` on ``sock`` until Ctrl-C (SIGINT) or SIGTERM; closes the socket.

    uvicorn shuts down gracefully on the signal, then raises it again; a Ctrl-C
    therefore ends here as a normal return, not a traceback.
    """
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3)
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        if on_stop is not None:
            on_stop()
