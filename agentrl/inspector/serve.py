"""Serving the inspector: bind the port (a clear error when it is taken), run, stop on Ctrl-C."""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

__all__ = ["ServeError", "bind", "is_loopback", "serve"]


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


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
