"""The key that closes a vLLM server's routes when it listens off loopback.

agentrl runs its servers with ``VLLM_SERVER_DEV_MODE=1`` (weight sync needs
``/collective_rpc``, ``/pause``, ``/resume``, ...). vLLM 0.32's own ``--api-key``
guards only paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``: the dev
routes, ``/metrics`` and ``/openapi.json`` stay open. A server bound to a
non-loopback address therefore gets :class:`ServerKeyMiddleware` through vLLM's
``--middleware`` flag: every request but ``GET /health`` needs
``Authorization: Bearer <key>``. The key travels to the server in the environment
(:data:`KEY_ENV`), never on its command line.

Example:
    >>> headers = auth_headers("s3cret")
    >>> headers["Authorization"]
    'Bearer s3cret'
    >>> is_loopback("127.0.0.1"), is_loopback("10.0.0.7")
    (True, False)
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from agentrl.runtime.doors import is_loopback, same_secret, secret_digest, send_unauthorized

__all__ = [
    "KEY_ENV",
    "MIDDLEWARE",
    "OPEN_PATHS",
    "ServerKeyMiddleware",
    "auth_headers",
    "is_loopback",
    "new_key",
]

KEY_ENV = "AGENTRL_SERVER_KEY"
"""Environment variable that hands the key to the server process."""
MIDDLEWARE = "agentrl.inference.auth.ServerKeyMiddleware"
"""The ``--middleware`` import path given to vLLM."""
OPEN_PATHS = frozenset({"/health"})
"""Paths answered without the key (readiness probes)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def new_key() -> str:
    """A fresh random key (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def auth_headers(key: str | None) -> dict[str, str]:
    """The request headers that carry ``key`` (none when there is no key)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


class ServerKeyMiddleware:
    """Pure ASGI middleware: refuses (401) every request without the bearer key.

    Only :data:`OPEN_PATHS` pass without it. The comparison is constant-time over
    SHA-256 digests, so neither the key's content nor its length leaks through timing.

    Args:
        app: The wrapped application.
        key: The key (None: read from :data:`KEY_ENV`, as in the server process).

    Raises:
        RuntimeError: No key given and :data:`KEY_ENV` unset (the server must not
            start open).
    """

    def __init__(self, app: ASGIApp, key: str | None = None) -> None:
        key = key or os.environ.get(KEY_ENV)
        if not key:
            raise RuntimeError(
                f"{MIDDLEWARE} needs the server key in the environment variable {KEY_ENV}"
            )
        self.app = app
        self._digest = secret_digest(key)

    def allowed(self, scope: Scope) -> bool:
        """Whether the request may pass (open path, or the right bearer key)."""
        path = scope.get("path", "").removeprefix(scope.get("root_path", "")) or "/"
        if path in OPEN_PATHS:
            return True
        value = b""
        for name, v in scope.get("headers") or ():
            if name.lower() == b"authorization":
                value = v
                break
        scheme, _, token = value.decode("latin-1").partition(" ")
        ok = same_secret(token.strip(), self._digest)
        return ok and scheme.lower() == "bearer"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket") or self.allowed(scope):
            await self.app(scope, receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            body = json.dumps({"error": "Unauthorized: missing or wrong bearer key"}).encode()
            await send_unauthorized(
                send, body, b"application/json", [(b"www-authenticate", b"Bearer")]
            )
