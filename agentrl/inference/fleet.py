"""A fleet of vLLM servers: launched or attached, routed, health-checked, weight-synced.

``async with await Fleet.launch(ServerConfig(model=path), num_servers=2) as fleet:``
starts the servers (concurrently), builds a :class:`~agentrl.inference.router.Router`
over them, runs periodic health checks and owns a
:class:`~agentrl.inference.weight_sync.WeightSync`. A server that dies or stops
answering is taken out of rotation (its in-flight episodes are re-sent elsewhere
by the router), restarted on its port, loaded with the current weights and put
back. Attached servers (``Fleet.attach(urls)``) are health-checked and put back
when they answer again, but not restarted. Whoever runs attached servers may
:meth:`Fleet.retire` one that is gone for good (out of rotation, no longer checked) and
:meth:`Fleet.add_server` a new one (it joins with the current weights). With
``lora_adapters=True`` the fleet serves LoRA adapters instead
(:class:`~agentrl.inference.lora_sync.AdapterSync`: a push hot-loads a new adapter
version; a restarted server loads the current one).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import httpx

from agentrl.inference.auth import new_key
from agentrl.inference.lora_sync import AdapterSync
from agentrl.inference.protocol import Generation, SamplingParams
from agentrl.inference.router import Router
from agentrl.inference.server import ServerConfig, VLLMServer
from agentrl.inference.weight_sync import PauseMode, SyncReport, WeightSync
from agentrl.runtime.lifecycle import AsyncClosing

__all__ = ["Fleet"]

log = logging.getLogger(__name__)


class Fleet(AsyncClosing):
    """Servers + router + health checks + weight sync. Use :meth:`launch` or :meth:`attach`.

    Args:
        router: Routes requests over the servers.
        servers: The launched servers, aligned with ``router.servers`` (None where attached).
        health_interval_s: Seconds between health checks.
        health_timeout_s: Timeout of one ``/health`` call.
        unhealthy_after: Consecutive failed checks that take a server out.
        sync_mode: Default pause mode of weight syncs.
        sync_recover_timeout_s: How long a weight sync that no server took waits for a
            server to recover (restarted, or answering again) and load the weights.
        lora_adapters: Serve LoRA adapters (pushes are adapters, hot-loaded as new
            versions; servers need ``--enable-lora``) instead of full weights.
    """

    def __init__(
        self,
        router: Router,
        servers: Sequence[VLLMServer | None],
        *,
        health_interval_s: float = 2.0,
        health_timeout_s: float = 5.0,
        unhealthy_after: int = 2,
        sync_mode: PauseMode = "keep",
        sync_recover_timeout_s: float = 900.0,
        lora_adapters: bool = False,
    ) -> None:
        self.router = router
        self.servers = list(servers)
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.unhealthy_after = unhealthy_after
        self.weight_sync: WeightSync | AdapterSync = (
            AdapterSync(router, recover_timeout_s=sync_recover_timeout_s)
            if lora_adapters
            else WeightSync(router, mode=sync_mode, recover_timeout_s=sync_recover_timeout_s)
        )
        self.restarts = 0
        self._fails = [0] * len(self.servers)
        self._recovering: dict[int, asyncio.Task[None]] = {}
        self._retired: set[int] = set()
        self._joining: set[int] = set()
        self._health_task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def launch(
        cls,
        config: ServerConfig,
        num_servers: int = 1,
        *,
        ports: Sequence[int] | None = None,
        api: str = "generate",
        router_kwargs: dict[str, Any] | None = None,
        **fleet_kwargs: Any,
    ) -> Fleet:
        """Starts ``num_servers`` vLLM servers and returns the running fleet.

        The router speaks vLLM's token route (``api="generate"``) by default: it
        skips detokenization and reports exact per-token weight versions.

        Raises:
            ServerStartError: A server could not start (the others are stopped).
        """
        if ports is not None and len(ports) != num_servers:
            raise ValueError(f"{len(ports)} ports given for {num_servers} servers")
        if config.api_key is None:  # one key for the run's servers (used off loopback only)
            config = dataclasses.replace(config, api_key=new_key())
        servers = [VLLMServer(config, ports[i] if ports else None) for i in range(num_servers)]
        results = await asyncio.gather(*(s.start() for s in servers), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(s.stop() for s in servers))
            raise errors[0]
        router_kwargs = {"api_key": servers[0].api_key, **(router_kwargs or {})}
        router = Router([s.url for s in servers], api=api, **router_kwargs)
        fleet = cls(router, servers, **fleet_kwargs)
        await fleet.weight_sync.load_current_all()
        fleet.start_health_checks()
        return fleet

    @classmethod
    async def attach(
        cls,
        urls: Sequence[str],
        *,
        api: str = "completions",
        api_key: str | None = None,
        router_kwargs: dict[str, Any] | None = None,
        **fleet_kwargs: Any,
    ) -> Fleet:
        """A fleet over servers someone else runs (health-checked, not restarted);
        ``api_key``: their bearer key, sent on every request."""
        router = Router(urls, api=api, api_key=api_key, **(router_kwargs or {}))
        fleet = cls(router, [None] * len(urls), **fleet_kwargs)
        fleet.start_health_checks()
        return fleet

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.router.servers]

    @property
    def weight_version(self) -> int:
        return self.weight_sync.version

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        session_id: str | None = None,
        adapter_role: str | None = None,
    ) -> Generation:
        """Same as ``fleet.router.generate`` (a Fleet is an LLMClient too)."""
        return await self.router.generate(
            prompt_ids, params, session_id=session_id, adapter_role=adapter_role
        )

    async def sync_weights(
        self, weights: Any, *, mode: PauseMode | None = None, version: int | None = None
    ) -> SyncReport:
        """Pushes ``weights`` to every server; see :meth:`WeightSync.push` (with LoRA
        serving, :meth:`AdapterSync.push`: ``{role: adapter}`` or one adapter)."""
        return await self.weight_sync.push(weights, mode=mode, version=version)

    def retire(self, url: str) -> None:
        """Takes a server that is gone for good out of rotation; health checks skip it.

        Its in-flight requests fail over to the other servers (the router re-sends them).
        """
        state = self.router.server(url)
        self._retired.add(self.router.servers.index(state))
        self.router.set_healthy(state.url, False)

    async def add_server(self, url: str) -> None:
        """Adds an attached server: it loads the current weights and version, then joins
        the rotation (a retired server at the same URL is taken back).

        Raises:
            LLMError: The server could not load the weights (it is retired).
        """
        try:
            state = self.router.server(url)
        except KeyError:
            state = self.router.add_server(url)
            self.servers.append(None)
            self._fails.append(0)
        i = self.router.servers.index(state)
        self.router.set_healthy(state.url, False)  # not before it holds the current weights
        self._retired.discard(i)
        self._joining.add(i)  # health checks leave it alone meanwhile
        try:
            await self.weight_sync.load_current(state)
        except BaseException:
            self._retired.add(i)
            raise
        finally:
            self._joining.discard(i)
        self._fails[i] = 0
        self.router.set_healthy(state.url, True)

    def start_health_checks(self) -> None:
        """Starts the periodic health loop (idempotent)."""
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.create_task(self._health_loop(), name="fleet-health")

    async def _health_loop(self) -> None:
        async with httpx.AsyncClient(
            timeout=self.health_timeout_s, headers=self.router.headers
        ) as http:
            while not self._closed:
                try:
                    await self.check_health(http)
                except Exception as e:  # the loop must outlive any one bad check
                    log.error("health check failed: %s", e)
                await asyncio.sleep(self.health_interval_s)

    async def check_health(self, http: httpx.AsyncClient) -> None:
        """Checks every server once; starts recovery of the failed ones."""

        async def ok(i: int) -> bool:
            proc = self.servers[i]
            if proc is not None and not proc.is_alive():
                return False
            try:
                r = await http.get(f"{self.router.servers[i].url}/health")
                return r.status_code == 200
            except httpx.HTTPError:
                return False

        results = await asyncio.gather(*(ok(i) for i in range(len(self.servers))))
        for i, good in enumerate(results):
            state = self.router.servers[i]
            if i in self._recovering or i in self._retired or i in self._joining:
                continue
            if good:
                self._fails[i] = 0
                if not state.healthy:  # answering again: catch up on weights, rejoin
                    # In the background: loading waits for a push in progress to let go.
                    self._recovering[i] = asyncio.create_task(self._rejoin(i))
                continue
            self._fails[i] += 1
            proc = self.servers[i]
            dead = proc is not None and not proc.is_alive()
            if dead or self._fails[i] >= self.unhealthy_after or not state.healthy:
                self.router.set_healthy(state.url, False)
                if self.servers[i] is not None:
                    self._recovering[i] = asyncio.create_task(self._recover(i))

    async def _rejoin(self, i: int) -> None:
        """Loads the current weights into an attached server that answers again."""
        state = self.router.servers[i]
        try:
            await self.weight_sync.load_current(state)
        except Exception as e:
            log.warning("%s answers but could not load weights: %s", state.url, e)
            return
        finally:
            self._recovering.pop(i, None)
        self.router.set_healthy(state.url, True)

    async def _recover(self, i: int) -> None:
        """Restarts server ``i``, loads the current weights, puts it back in rotation."""
        server, state = self.servers[i], self.router.servers[i]
        assert server is not None
        try:
            while not self._closed:
                log.warning("inference server %s is down; restarting it", state.url)
                try:
                    await server.stop(grace_s=5.0)
                    await server.start()
                    await self.weight_sync.load_current(state)
                except Exception as e:  # keep trying: an episode must not be lost
                    log.error("restart of %s failed: %s", state.url, e)
                    await asyncio.sleep(5.0)
                    continue
                self.restarts += 1
                self._fails[i] = 0
                self.router.set_healthy(state.url, True)
                return
        finally:
            self._recovering.pop(i, None)

    async def close(self) -> None:
        """Stops health checks, recoveries, launched servers and clients (idempotent)."""
        self._closed = True
        tasks = [t for t in (self._health_task, *self._recovering.values()) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await asyncio.gather(*(s.stop() for s in self.servers if s is not None))
        await self.router.close()
        self.weight_sync.close()
