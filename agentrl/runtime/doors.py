"""Doors of the sockets agentrl listens on: who can reach them, and the secrets that open them.

Used by the vLLM servers' key (``agentrl.inference.auth``), the gateway's session
tokens and the inspector's token: secrets are compared as SHA-256 digests with
:func:`hmac.compare_digest`, so neither their content nor their length leaks through
timing.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

__all__ = ["is_loopback", "same_secret", "secret_digest", "send_unauthorized"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only.

    >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("10.0.0.7")
    (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def secret_digest(secret: str) -> bytes:
    """SHA-256 of ``secret`` (what is kept and compared instead of the secret)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def same_secret(given: str, digest: bytes) -> bool:
    """Whether ``given`` is the secret of ``digest``, in constant time.

    >>> d = secret_digest("s3cret")
    >>> same_secret("s3cret", d), same_secret("s3cres", d)
    (True, False)
    """
    return hmac.compare_digest(secret_digest(given), digest)


async def send_unauthorized(
    send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    body: bytes,
    content_type: bytes,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Answers an ASGI HTTP request with 401 and ``body``."""
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
