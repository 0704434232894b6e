"""Routing episodes across vLLM servers: least-loaded placement, sticky turns, failover.

A new episode (``session_id`` not seen before) goes to the healthy server with the
fewest in-flight requests. Every later turn goes back to the same server, whose
prefix cache holds the episode's history, unless that server is down or has
``overload_threshold`` more requests in flight than the least-loaded one; then the
episode moves (counted in ``moves``). With ``group_of``, the episodes of one group
(same task, same prompt prefix) start on the same server (group affinity).

A request that fails because its server is unreachable or died mid-request is
re-sent to another server with the same full token history (counted in
``failovers``); with no healthy server it waits for one to come back.

With LoRA serving (``adapters`` set, by :class:`~agentrl.inference.lora_sync.AdapterSync`)
a request is sent to the current adapter of its role (``adapter_role``, default
``policy``) on its server, as the request's ``model``, and every token it returns is
labelled with that adapter's version.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from agentrl.inference.adapters import DEFAULT_ROLE, AdapterTable
from agentrl.inference.auth import auth_headers
from agentrl.inference.client import CompletionsClient, ServerUnavailable, make_client
from agentrl.inference.protocol import Generation, LLMError, SamplingParams
from agentrl.runtime.lifecycle import AsyncClosing

__all__ = ["Router", "ServerState", "parse_prefix_cache"]


@dataclass
class ServerState:
    """Live counters of one server (mutable; read them, don't write them).

    Attributes:
        url: Server root URL.
        client: Its HTTP client.
        healthy: In rotation.
        weight_version: Version of the weights it serves.
        in_flight: Requests sent and not yet answered.
        requests: Requests answered.
        prompt_tokens: Prompt tokens sent.
        generated_tokens: Tokens generated.
        errors: Requests that failed on it.
        prefix_queries: Prefix-cache token queries (from /metrics).
        prefix_hits: Prefix-cache token hits (from /metrics).
    """

    url: str
    client: CompletionsClient
    healthy: bool = True
    weight_version: int = 0
    in_flight: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    errors: int = 0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0


def parse_prefix_cache(metrics_text: str) -> tuple[float, float]:
    """(queries, hits) summed over ``vllm:prefix_cache_{queries,hits}_total`` lines."""
    q = h = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("vllm:prefix_cache_queries_total"):
            q += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_hits_total"):
            h += float(line.rsplit(" ", 1)[1])
    return q, h


class Router(AsyncClosing):
    """An :class:`~agentrl.inference.protocol.LLMClient` over several servers.

    Args:
        urls: Server root URLs.
        api: "completions" (``/v1/completions``) or "generate" (vLLM's token route).
        overload_threshold: In-flight lead over the least-loaded server at which a
            sticky episode moves.
        group_of: Maps a session id to its group id, for group affinity (None: off).
        max_failovers: Times one request may be re-sent after server failures.
        wait_for_server_s: How long a request waits for any healthy server.
        max_sessions: Sticky assignments remembered (least recently used dropped).
        client_kwargs: Passed to each server's client (timeouts, pool size, ...).
        api_key: Bearer key of the servers (sent by their clients, the metrics scrape,
            health checks and weight syncs); None: servers without a key.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        api: str = "completions",
        overload_threshold: int = 32,
        group_of: Callable[[str], str | None] | None = None,
        max_failovers: int = 8,
        wait_for_server_s: float = 900.0,
        max_sessions: int = 200_000,
        client_kwargs: dict[str, Any] | None = None,
        api_key: str | None = None,
    ) -> None:
        if not urls:
            raise ValueError("Router needs at least one server URL")
        self.api = api
        self.overload_threshold = overload_threshold
        self.group_of = group_of
        self.max_failovers = max_failovers
        self.wait_for_server_s = wait_for_server_s
        self.max_sessions = max_sessions
        self._client_kwargs = dict(client_kwargs or {})
        self.api_key = api_key
        self.servers: list[ServerState] = []
        for u in urls:
            self.add_server(u)
        self.moves = 0
        self.failovers = 0
        self._sessions: OrderedDict[str, ServerState] = OrderedDict()
        self._groups: OrderedDict[str, ServerState] = OrderedDict()
        self._changed = asyncio.Event()
        self.adapters: AdapterTable | None = None
        """LoRA serving: the adapter each server serves per role (None: full weights)."""

    def add_server(self, url: str, *, weight_version: int = 0) -> ServerState:
        """Adds a server to the rotation."""
        url = url.rstrip("/")
        box: list[ServerState] = []
        client = make_client(
            self.api,
            url,
            weight_version=lambda: box[0].weight_version,
            api_key=self.api_key,
            **self._client_kwargs,
        )
        state = ServerState(url=url, client=client, weight_version=weight_version)
        box.append(state)
        self.servers.append(state)
        return state

    @property
    def headers(self) -> dict[str, str]:
        """Headers of every control call to the servers (the bearer key, if any)."""
        return auth_headers(self.api_key)

    def server(self, url: str) -> ServerState:
        """The state of the server at ``url``."""
        url = url.rstrip("/")
        for s in self.servers:
            if s.url == url:
                return s
        raise KeyError(url)

    def set_healthy(self, url: str, healthy: bool) -> None:
        """Takes a server out of rotation or puts it back."""
        self.server(url).healthy = healthy
        self._changed.set()

    async def close(self) -> None:
        """Closes every server's client (idempotent)."""
        for s in self.servers:
            await s.client.close()

    def _remember(self, table: OrderedDict[str, ServerState], key: str, s: ServerState) -> None:
        table[key] = s
        table.move_to_end(key)
        while len(table) > self.max_sessions:
            table.popitem(last=False)

    def _least_loaded(self, exclude: ServerState | None = None) -> ServerState | None:
        up = [s for s in self.servers if s.healthy and s is not exclude]
        if not up:
            return None
        return min(up, key=lambda s: (s.in_flight, s.requests, self.servers.index(s)))

    def _overloaded(self, s: ServerState) -> bool:
        best = self._least_loaded()
        return best is not None and s.in_flight - best.in_flight >= self.overload_threshold

    def place(self, session_id: str | None) -> ServerState | None:
        """Chooses the server for the next request of ``session_id`` (None: none is up)."""
        if session_id is None:
            return self._least_loaded()
        sticky = self._sessions.get(session_id)
        if sticky is not None and sticky.healthy and not self._overloaded(sticky):
            self._sessions.move_to_end(session_id)
            return sticky
        target = None
        group = self.group_of(session_id) if (self.group_of and sticky is None) else None
        if group is not None:
            g = self._groups.get(group)
            if g is not None and g.healthy and not self._overloaded(g):
                target = g
        target = target or self._least_loaded()
        if target is None:
            return None
        if sticky is not None and target is not sticky:
            self.moves += 1
        self._remember(self._sessions, session_id, target)
        if group is not None:
            self._remember(self._groups, group, target)
        return target

    async def _wait_for_server(self, session_id: str | None, deadline: float) -> ServerState:
        while True:
            s = self.place(session_id)
            if s is not None:
                return s
            if time.monotonic() > deadline:
                raise LLMError(
                    f"no healthy inference server for {self.wait_for_server_s:.0f}s "
                    f"(servers: {', '.join(x.url for x in self.servers)})"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=1.0)

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        session_id: str | None = None,
        adapter_role: str | None = None,
    ) -> Generation:
        """Generates on the chosen server, re-sending elsewhere if it fails.

        ``adapter_role``: with LoRA serving, whose adapter samples (None: ``policy``);
        ignored when the servers serve full weights.
        """
        deadline = time.monotonic() + self.wait_for_server_s
        attempt = 0
        while True:
            s = await self._wait_for_server(session_id, deadline)
            s.in_flight += 1
            table = self.adapters
            adapter = table.acquire(s.url, adapter_role or DEFAULT_ROLE) if table else None
            try:
                if adapter is None:
                    gen = await s.client.generate(prompt_ids, params, session_id=session_id)
                else:
                    gen = await s.client.generate(
                        prompt_ids, params, session_id=session_id,
                        model=adapter.name, version=adapter.version,
                    )  # fmt: skip
            except ServerUnavailable:
                s.errors += 1
                if attempt >= self.max_failovers:
                    raise
                attempt += 1
                self.failovers += 1
                if s.healthy:
                    s.healthy = False  # the health checker brings it back
                    self._changed.set()
                continue
            finally:
                s.in_flight -= 1
                if table is not None:
                    table.release(s.url, adapter)
            s.requests += 1
            s.prompt_tokens += len(prompt_ids)
            s.generated_tokens += len(gen.token_ids)
            return gen

    async def scrape_metrics(self, timeout_s: float = 5.0) -> None:
        """Reads each server's prefix-cache counters from its ``/metrics``."""

        async def one(s: ServerState, http: httpx.AsyncClient) -> None:
            try:
                r = await http.get(f"{s.url}/metrics")
                if r.status_code == 200:
                    s.prefix_queries, s.prefix_hits = parse_prefix_cache(r.text)
            except httpx.HTTPError:
                pass

        async with httpx.AsyncClient(timeout=timeout_s, headers=self.headers) as http:
            await asyncio.gather(*(one(s, http) for s in self.servers))

    def metrics(self) -> dict[str, float]:
        """Flat metrics: fleet totals and ``server/<i>/<name>`` per server."""
        out: dict[str, float] = {"router/moves": self.moves, "router/failovers": self.failovers}
        for i, s in enumerate(self.servers):
            p = f"server/{i}/"
            out[p + "healthy"] = float(s.healthy)
            out[p + "in_flight"] = s.in_flight
            out[p + "requests"] = s.requests
            out[p + "prompt_tokens"] = s.prompt_tokens
            out[p + "generated_tokens"] = s.generated_tokens
            out[p + "errors"] = s.errors
            out[p + "weight_version"] = s.weight_version
            if s.prefix_queries:
                out[p + "prefix_cache_hit_rate"] = s.prefix_hits / s.prefix_queries
        return out
