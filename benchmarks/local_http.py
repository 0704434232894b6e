"""A benchmark's local HTTP server in a subprocess: started on a free port, ready on
``/health``, killed by the caller.

Example::

    srv, url = start_http(lambda port: [sys.executable, "-m", "mod", "--port", str(port)])
    try:
        ...
    finally:
        srv.kill()
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

from agentrl.inference.server import free_port

__all__ = ["start_http"]


def start_http(
    command: Callable[[int], list[str]], *, timeout_s: float = 30.0
) -> tuple[subprocess.Popen[bytes], str]:
    """Runs ``command(port)`` on a free loopback port and waits for its ``/health``.

    Raises:
        RuntimeError: It exited, or did not answer within ``timeout_s`` (it is killed).
    """
    import httpx

    port = free_port()
    srv = subprocess.Popen(command(port))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/health", timeout=1).raise_for_status()
            return srv, url
        except httpx.HTTPError:
            if srv.poll() is not None:
                break
            time.sleep(0.05)
    srv.kill()
    raise RuntimeError(f"the scripted server did not start on {url}")
