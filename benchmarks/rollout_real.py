"""Rollout throughput on a real model: AgentLoop + Router vs the same vLLM server driven directly.

One fp32 vLLM-CPU server serves SmolLM2-135M-Instruct (``agentrl model get
smollm2-135m``). Two arms, alternated (L D L D …), each from an empty prefix cache:

* loop: ``RolloutRunner`` → ``AgentLoop`` → ``Fleet``'s Router → server; ``episodes``
  concurrent conversations of ``turns`` turns (a tool-free env that says "go on"), so
  the loop's work is chat-template deltas, parsing, bookkeeping and routing.
* direct: a bare httpx client replays the same work: for each episode of the loop
  arm just before it, the same first prompt, the same number of generated tokens per
  turn (``ignore_eos``) and the same observation tokens appended after its own sampled
  tokens, all episodes concurrent, turns in order.

Throughput = generated tokens / wall seconds; the figure is loop / direct (target ≥ 0.95).
Run: ``python -m benchmarks.rollout_real [--episodes 32 --turns 4 --rounds 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from agentrl import Env, Message, StepResult
from agentrl.inference.fleet import Fleet
from agentrl.inference.protocol import SamplingParams
from agentrl.inference.server import ServerConfig
from agentrl.models.registry import get_model
from agentrl.rollout import AgentLoop, LoopConfig, RolloutRunner
from agentrl.types import Trajectory
from benchmarks.inference_common import reset_prefix_caches
from benchmarks.report import report


class GoOn(Env):
    """A conversation without tools: the user says "go on" until ``turns`` model turns."""

    max_turns = 64

    def __init__(self, turns: int) -> None:
        self.turns, self.t = turns, 0

    async def reset(self, task, *, seed=None):
        return [Message.user(f"Tell me about topic number {task['id']}, one fact at a time.")]

    async def step(self, action):
        self.t += 1
        done = self.t >= self.turns
        return StepResult(observation=[Message.user("Go on.")], terminated=done)


@dataclass(frozen=True)
class Plan:
    """One episode's work, read off a loop trajectory: what the direct arm replays."""

    first_prompt: list[int]
    generated: list[int]  # tokens generated per turn
    observations: list[list[int]]  # tokens appended after turn t (before turn t + 1)


def plan_of(t: Trajectory) -> Plan:
    runs: list[tuple[int, int]] = []  # [start, end) of each run of model tokens
    for i, m in enumerate(t.loss_mask):
        if m and (not runs or runs[-1][1] != i):
            runs.append((i, i + 1))
        elif m:
            runs[-1] = (runs[-1][0], i + 1)
    ids = list(t.token_ids)
    obs = [ids[a[1] : b[0]] for a, b in itertools.pairwise(runs)]
    return Plan(ids[: runs[0][0]], [b - a for a, b in runs], obs)


async def loop_arm(fleet: Fleet, tok, episodes: int, turns: int, max_tokens: int):
    cfg = LoopConfig(
        max_turns=turns,
        max_total_tokens=2048,
        max_tokens_per_turn=max_tokens,
        sampling=SamplingParams(temperature=1.0),
    )
    runner = RolloutRunner(AgentLoop(fleet, tok, cfg), lambda: GoOn(turns), max_concurrency=256)
    t0 = time.perf_counter()
    result = await runner.run([{"id": i} for i in range(episodes)])
    wall = time.perf_counter() - t0
    trajs = [t for t in result.trajectories if sum(t.loss_mask)]
    return wall, sum(sum(t.loss_mask) for t in trajs), [plan_of(t) for t in trajs]


async def direct_arm(url: str, plans: Sequence[Plan]) -> tuple[float, int]:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=512)) as http:

        async def episode(p: Plan) -> int:
            ids, n = list(p.first_prompt), 0
            for t, k in enumerate(p.generated):
                body = {
                    "prompt": ids, "max_tokens": k, "temperature": 1.0, "ignore_eos": True,
                    "logprobs": 0, "return_token_ids": True,
                }  # fmt: skip
                r = await http.post(f"{url}/v1/completions", json=body)
                r.raise_for_status()
                out = list(r.json()["choices"][0]["token_ids"])
                n += len(out)
                ids += out + (p.observations[t] if t < len(p.observations) else [])
            return n

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(episode(p) for p in plans))
        return time.perf_counter() - t0, sum(counts)


async def main(episodes: int, turns: int, rounds: int, max_tokens: int) -> dict[str, float]:
    from transformers import AutoTokenizer

    model = str(get_model("smollm2-135m"))
    tok = AutoTokenizer.from_pretrained(model)
    cfg = ServerConfig(
        model=model, dtype="float32", max_model_len=2048, max_num_seqs=64, kv_cache_gib=1,
        startup_timeout_s=600,
    )  # fmt: skip
    fleet = await Fleet.launch(cfg, num_servers=1, health_interval_s=5.0)
    try:
        url = fleet.urls[0]
        await loop_arm(fleet, tok, 4, 1, 8)  # warm-up
        rates: dict[str, list[float]] = {"loop": [], "direct": []}
        for r in range(rounds):
            await reset_prefix_caches(fleet.urls)
            wall, n, plans = await loop_arm(fleet, tok, episodes, turns, max_tokens)
            rates["loop"].append(n / wall)
            await reset_prefix_caches(fleet.urls)
            d_wall, d_n = await direct_arm(url, plans)
            assert d_n == n, (d_n, n)  # the same generated tokens in both arms
            rates["direct"].append(d_n / d_wall)
            print(
                f"round {r}: loop {n} tok in {wall:.1f}s ({n / wall:.0f} tok/s); "
                f"direct {d_n} tok in {d_wall:.1f}s ({d_n / d_wall:.0f} tok/s)",
                flush=True,
            )
        loop_rate = sum(rates["loop"]) / rounds
        direct_rate = sum(rates["direct"]) / rounds
        ratio = loop_rate / direct_rate
        print(
            f"SmolLM2-135M fp32, 1 vLLM-CPU server, {episodes} episodes x {turns} turns, "
            f"<= {max_tokens} tokens/turn: loop {loop_rate:.0f} tok/s, direct {direct_rate:.0f} "
            f"tok/s, loop/direct {ratio:.3f} (target >= 0.95)"
        )
        report("loop_over_direct_tok_s", ratio, target=0.95, unit="x", baseline=direct_rate)
        return {"loop_tok_s": loop_rate, "direct_tok_s": direct_rate, "ratio": ratio}
    finally:
        await fleet.close()


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=48)
    a = p.parse_args()
    asyncio.run(main(a.episodes, a.turns, a.rounds, a.max_tokens))


if __name__ == "__main__":
    cli()
