"""Router: least-loaded placement, stickiness, overload moves, group affinity, failover."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from agentrl.inference.protocol import LLMError, SamplingParams
from agentrl.inference.router import Router, parse_prefix_cache
from tests.helpers.http_fakes import FakeServer, Seen

URLS = ["http://a:1", "http://b:1", "http://c:1"]

P = SamplingParams(max_tokens=1)


class FakeServers:
    """Three real HTTP servers answering /v1/completions; can hold requests or go down."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.gate: asyncio.Event | None = None
        self.servers: list[FakeServer] = []
        self.urls: list[str] = []

    async def start(self, n: int = 3) -> FakeServers:
        for _ in range(n):
            srv = FakeServer(self._answer_for(len(self.servers)))
            self.servers.append(await srv.start())
        self.urls = [s.url for s in self.servers]
        return self

    def _answer_for(self, i: int) -> Any:
        async def answer(seen: Seen, n: int) -> web.Response:
            url = self.servers[i].url
            self.calls[url] = self.calls.get(url, 0) + 1
            if self.gate is not None:
                await self.gate.wait()
            body = {"choices": [{"token_ids": [len(seen.body["prompt"])],
                                 "logprobs": {"token_logprobs": [-0.1]},
                                 "finish_reason": "length"}]}  # fmt: skip
            return web.json_response(body)

        return answer

    async def down(self, url: str) -> None:
        """The server at ``url`` stops: its connections close, new ones are refused."""
        await self.servers[self.urls.index(url)].stop()

    async def close(self) -> None:
        for s in self.servers:
            await s.stop()


@asynccontextmanager
async def make_router(**kw: Any) -> AsyncIterator[tuple[Router, FakeServers]]:
    fake = await FakeServers().start()
    kw.setdefault("client_kwargs", {})
    kw["client_kwargs"] |= {"retries": 0}
    try:
        async with Router(fake.urls, **kw) as r:
            yield r, fake
    finally:
        await fake.close()


async def test_new_sessions_go_to_least_loaded_then_stick():
    async with make_router() as (r, fake):
        fake.gate = asyncio.Event()
        first = [asyncio.create_task(r.generate([1], P, session_id=f"e{i}")) for i in range(3)]
        await asyncio.sleep(0.05)
        assert [s.in_flight for s in r.servers] == [1, 1, 1]  # spread, one each
        fake.gate.set()
        gens = await asyncio.gather(*first)
        where = {f"e{i}": g.server for i, g in enumerate(gens)}
        assert len(set(where.values())) == 3
        for _ in range(3):  # later turns of each episode return to its server
            gens = await asyncio.gather(*(r.generate([1, 2], P, session_id=e) for e in where))
            assert {e: g.server for e, g in zip(where, gens, strict=True)} == where
        assert r.moves == 0 and r.failovers == 0
        assert sum(s.requests for s in r.servers) == 12


async def test_overloaded_sticky_server_moves_the_episode():
    async with make_router(overload_threshold=2) as (r, _):
        g = await r.generate([1], P, session_id="sticky")
        home = r.server(g.server)
        home.in_flight += 5  # pretend it is busy with other work
        g2 = await r.generate([1, 2], P, session_id="sticky")
        assert g2.server != home.url and r.moves == 1
        home.in_flight -= 5
        g3 = await r.generate([1, 2, 3], P, session_id="sticky")
        assert g3.server == g2.server  # stays on its new home


async def test_group_affinity_puts_a_group_on_one_server():
    async with make_router(group_of=lambda s: s.split("/")[0]) as (r, _):
        gens = [
            await r.generate([1], P, session_id=f"task{t}/ep{e}")
            for t in range(2)
            for e in range(3)
        ]
        assert len({g.server for g in gens[:3]}) == 1
        assert len({g.server for g in gens[3:]}) == 1
        assert gens[0].server != gens[3].server


async def test_failed_server_is_skipped_and_the_request_resent():
    async with make_router() as (r, fake):
        g = await r.generate([1], P, session_id="ep")
        assert g.server is not None
        await fake.down(g.server)
        g2 = await r.generate([1, 2, 3], P, session_id="ep")
        assert g2.server != g.server and g2.token_ids == [3]  # full history re-sent
        assert r.failovers == 1 and not r.server(g.server).healthy
        assert r.server(g.server).errors == 1


async def test_waits_for_a_server_to_come_back():
    async with make_router(wait_for_server_s=5) as (r, fake):
        for u in fake.urls:
            r.set_healthy(u, False)
        task = asyncio.create_task(r.generate([1], P, session_id="ep"))
        await asyncio.sleep(0.1)
        assert not task.done()
        r.set_healthy(fake.urls[1], True)
        g = await asyncio.wait_for(task, 5)
        assert g.server == fake.urls[1]


async def test_no_server_for_too_long_is_an_error():
    async with make_router(wait_for_server_s=0.2) as (r, fake):
        for u in fake.urls:
            r.set_healthy(u, False)
        with pytest.raises(LLMError, match="no healthy inference server"):
            await r.generate([1], P)


def test_parse_prefix_cache_and_metrics():
    text = (
        "# HELP vllm:prefix_cache_queries_total x\n"
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 200.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 150.0\n'
        'vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9\n'
    )
    assert parse_prefix_cache(text) == (200.0, 150.0)
    r = Router(URLS[:1])
    r.servers[0].prefix_queries, r.servers[0].prefix_hits = 200.0, 150.0
    m = r.metrics()
    assert m["server/0/prefix_cache_hit_rate"] == 0.75 and m["router/moves"] == 0


def test_router_needs_servers():
    with pytest.raises(ValueError, match="at least one"):
        Router([])
