"""A weight sync that hangs on the only server waits for the fleet to recover it (issue #18).

The server is a real HTTP server (FastAPI + uvicorn in a thread) that speaks the
control routes a weight sync uses and can freeze: every call, ``/health`` included,
then hangs, as a SIGSTOPped vLLM server does. The fleet's real health loop takes it
out of rotation and puts it back (loading the current weights) once it answers.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import torch
from fastapi import FastAPI, Request

from agentrl.inference.fleet import Fleet
from agentrl.inference.protocol import LLMError
from agentrl.testing.scripted_server import _free_port


class FreezableServer:
    """vLLM's control routes (pause, collective_rpc, reset, version, resume, health)."""

    def __init__(self) -> None:
        self.port = _free_port("127.0.0.1")
        self.running = threading.Event()  # cleared: frozen, every call hangs
        self.running.set()
        self.closing = threading.Event()
        self.freeze_on_reload = False
        self.reloads: list[str] = []
        self.version = "0"
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _hang_while_frozen(self) -> None:
        if not self.running.is_set():
            await asyncio.to_thread(self.running.wait)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> dict[str, str]:
            await self._hang_while_frozen()
            return {}

        @app.post("/collective_rpc")
        async def rpc(req: Request) -> dict[str, str]:
            body = await req.json()
            if self.freeze_on_reload:  # this call never returns (its process is gone)
                self.freeze_on_reload = False
                self.running.clear()
                await asyncio.to_thread(self.closing.wait)
            await self._hang_while_frozen()
            self.reloads.append(body["kwargs"]["weights_path"])
            return {}

        @app.post("/update_weight_version")
        async def version(req: Request) -> dict[str, str]:
            await self._hang_while_frozen()
            self.version = (await req.json())["new_version"]
            return {}

        for route in ("/pause", "/resume", "/reset_prefix_cache"):

            async def control() -> dict[str, str]:
                await self._hang_while_frozen()
                return {}

            app.post(route)(control)
        return app

    def __enter__(self) -> FreezableServer:
        import uvicorn

        cfg = uvicorn.Config(self.app(), host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        while not self._server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.running.set()
        self.closing.set()
        self._server.should_exit = True
        assert self._thread is not None
        self._thread.join(timeout=10)


WEIGHTS = {"w": torch.zeros(4)}


def _fleet(url: str, **kw: Any) -> Any:
    return Fleet.attach([url], health_interval_s=0.2, health_timeout_s=0.5, unhealthy_after=1, **kw)


async def test_a_hang_during_the_sync_waits_for_the_recovered_server() -> None:
    with FreezableServer() as srv:
        fleet = await _fleet(srv.url, sync_recover_timeout_s=60)
        try:
            fleet.weight_sync.timeout_s = 30  # a hang is noticed by health checks, not this
            srv.freeze_on_reload = True

            async def thaw() -> None:  # the server answers again after 2 s (e.g. restarted)
                await asyncio.sleep(2.0)
                srv.running.set()

            thawing = asyncio.create_task(thaw())
            t0 = time.monotonic()
            report = await fleet.sync_weights(WEIGHTS, mode="keep")
            took = time.monotonic() - t0
            await thawing
        finally:
            await fleet.close()
    assert report.version == 1
    # The recovered server was loaded with v1's weights by the fleet's rejoin, and
    # labelled v1; the push waited for that rather than failing the run.
    assert srv.version == "1" and srv.reloads and srv.reloads[-1].endswith("v1")
    assert fleet.router.servers[0].healthy and fleet.router.servers[0].weight_version == 1
    assert 1.5 < took < 20, took


async def test_a_server_that_never_recovers_fails_the_sync_with_a_clear_message() -> None:
    with FreezableServer() as srv:
        fleet = await _fleet(srv.url, sync_recover_timeout_s=1.5)
        try:
            fleet.weight_sync.timeout_s = 30
            srv.freeze_on_reload = True
            t0 = time.monotonic()
            with pytest.raises(LLMError) as err:
                await fleet.sync_weights(WEIGHTS, mode="keep")
            took = time.monotonic() - t0
        finally:
            await fleet.close()
    msg = str(err.value)
    assert "weight sync v1 failed on every server" in msg and srv.url in msg
    assert "no server came back with the new weights within 2 s" in msg
    assert took < 15, took
