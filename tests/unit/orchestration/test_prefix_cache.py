"""PrefixCacheMeter: per-step deltas of the servers' prefix-cache counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.orchestration.prefix_cache import PrefixCacheMeter


@dataclass
class _Server:
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0


@dataclass
class _Router:
    servers: list[_Server] = field(default_factory=lambda: [_Server(), _Server()])
    reads: list[tuple[tuple[float, float], ...]] = field(default_factory=list)

    async def scrape_metrics(self) -> None:
        for s, (q, h) in zip(self.servers, self.reads.pop(0), strict=True):
            s.prefix_queries, s.prefix_hits = q, h


@dataclass
class _Fleet:
    router: _Router


async def test_a_step_counts_only_its_own_hits_over_both_servers() -> None:
    r = _Router(
        reads=[
            ((100, 10), (50, 0)),  # mark: after the first evaluation
            ((300, 110), (150, 50)),  # step 1: 300 queried, 150 hit
            ((400, 110), (150, 50)),  # step 2: 100 queried, 0 hit
            ((1000, 700), (150, 50)),  # mark again: a mid-run evaluation is left out
            ((1100, 780), (250, 70)),  # step 3: 200 queried, 100 hit
        ]
    )
    meter = PrefixCacheMeter(_Fleet(r))  # a run's client: a fleet over its router
    await meter.mark()
    assert await meter.step() == {
        "inference/prefix_cache_hit_rate": 0.5,
        "inference/prefix_cache_hit_tokens": 150.0,
    }
    assert await meter.step() == {
        "inference/prefix_cache_hit_rate": 0.0,
        "inference/prefix_cache_hit_tokens": 0.0,
    }
    await meter.mark()
    assert await meter.step() == {
        "inference/prefix_cache_hit_rate": 0.5,
        "inference/prefix_cache_hit_tokens": 100.0,
    }


async def test_no_counters_no_figures() -> None:
    assert await PrefixCacheMeter(object()).step() == {}  # a client that is not a Router
    r = _Router(reads=[((0, 0), (0, 0)), ((0, 0), (0, 0))])  # servers without /metrics
    meter = PrefixCacheMeter(r)
    await meter.mark()
    assert await meter.step() == {}
