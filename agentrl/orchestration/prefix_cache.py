"""The servers' own prefix-cache hits of each training step, as the servers count them.

vLLM exports monotonic counters (``vllm:prefix_cache_queries_total`` and
``vllm:prefix_cache_hits_total``, prompt tokens looked up and found in the cache); the
router reads them from each server's ``/metrics``. A :class:`PrefixCacheMeter` turns them
into a per-step ``inference/prefix_cache_hit_rate`` (hits / queries of the tokens the
step's requests asked for) and ``inference/prefix_cache_hit_tokens``: what tree rollouts'
shared prefixes (and a group's shared prompt) actually saved. Evaluations are left out:
:meth:`mark` after one starts the next step's count afresh.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PrefixCacheMeter"]


class PrefixCacheMeter:
    """Per-step deltas of the servers' prefix-cache counters (no-op for a client without them).

    Args:
        llm: The rollout client; a :class:`~agentrl.inference.router.Router` (its
            ``scrape_metrics`` and ``servers``) or a fleet holding one (``llm.router``)
            is measured, anything else is not.
    """

    def __init__(self, llm: Any) -> None:
        self.llm = getattr(llm, "router", llm)
        self._last: tuple[float, float] | None = None

    async def _read(self) -> tuple[float, float] | None:
        scrape, servers = (
            getattr(self.llm, "scrape_metrics", None),
            getattr(self.llm, "servers", None),
        )
        if scrape is None or servers is None:
            return None
        await scrape()
        return (
            float(sum(s.prefix_queries for s in servers)),
            float(sum(s.prefix_hits for s in servers)),
        )

    async def mark(self) -> None:
        """Starts the next count here (after an evaluation, at the start)."""
        self._last = await self._read()

    async def step(self) -> dict[str, float]:
        """The hit rate and hit tokens since the last call or :meth:`mark` ({} if unknown)."""
        now = await self._read()
        last, self._last = self._last, now
        if now is None or last is None:
            return {}
        queries, hits = now[0] - last[0], now[1] - last[1]
        if queries <= 0:  # no counters (a server without /metrics) or a restarted server
            return {}
        return {
            "inference/prefix_cache_hit_rate": hits / queries,
            "inference/prefix_cache_hit_tokens": hits,
        }
