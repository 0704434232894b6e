"""Shared pieces of the inference benchmarks: servers, a multi-turn workload, timing.

The workload: ``episodes`` concurrent episodes of ``turns`` turns; each starts from
a long history (``history`` tokens, distinct per episode unless ``shared`` is set)
and appends its generated tokens plus a short observation every turn, as an agent
does. Sampling is seeded per (episode, turn) and the untrained tiny model almost
never stops early, so every arm of a benchmark generates the same token counts.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from agentrl.inference.fleet import Fleet
from agentrl.inference.protocol import SamplingParams
from agentrl.inference.server import ServerConfig
from agentrl.models.tiny import TinyRecipe, ensure_tiny_model

GenerateFn = Callable[[list[int], SamplingParams, str], Awaitable[list[int]]]

UNTRAINED = TinyRecipe(steps=0, copy_steps=0, num_demos=0, max_position_embeddings=2048)


def server_config(recipe: TinyRecipe = UNTRAINED, **kw: object) -> ServerConfig:
    """A small CPU server config for the (untrained) tiny model."""
    model = ensure_tiny_model(recipe)
    base: dict[str, object] = {
        "model": str(model),
        "dtype": "float32",
        "max_model_len": 2048,
        "max_num_seqs": 64,
        "kv_cache_gib": 1,
        "startup_timeout_s": 600.0,
    }
    base.update(kw)
    return ServerConfig(**base)  # type: ignore[arg-type]  # keys are ServerConfig fields


async def launch(num_servers: int, **kw: object) -> Fleet:
    """Starts a fleet of the tiny model."""
    return await Fleet.launch(server_config(**kw), num_servers=num_servers, health_interval_s=5.0)


@dataclass(frozen=True)
class Workload:
    """A multi-turn workload (see the module docstring)."""

    episodes: int = 16
    turns: int = 4
    history: int = 600
    max_tokens: int = 24
    obs: int = 8
    shared: bool = False
    seed: int = 0

    def first_prompt(self, i: int) -> list[int]:
        rng = random.Random(self.seed * 7919 + (0 if self.shared else i))
        body = [rng.randrange(20, 3000) for _ in range(self.history)]
        return [1, *body, 2, 1, 10 + i % 50]  # distinct last token per episode


@dataclass(frozen=True)
class Result:
    seconds: float
    generated: int
    requests: int

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.seconds


async def run(work: Workload, gen: GenerateFn) -> Result:
    """Runs the workload through ``gen``; returns wall time and token counts."""
    counts = [0, 0]

    async def episode(i: int) -> None:
        ids = work.first_prompt(i)
        for t in range(work.turns):
            params = SamplingParams(
                max_tokens=work.max_tokens,
                temperature=1.0,
                seed=work.seed * 1_000_003 + i * 101 + t,
            )
            out = await gen(ids, params, f"ep-{work.seed}-{i}")
            counts[0] += len(out)
            counts[1] += 1
            ids = ids + out + [1] + [20 + (t + k) % 900 for k in range(work.obs)] + [2]

    t0 = time.perf_counter()
    await asyncio.gather(*(episode(i) for i in range(work.episodes)))
    return Result(time.perf_counter() - t0, counts[0], counts[1])


class DirectClient:
    """The minimal baseline: one pooled httpx client, raw /v1/completions, no bookkeeping."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)
        self.http = httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=4096))
        self._home: dict[str, str] = {}

    async def generate(self, ids: list[int], p: SamplingParams, session: str) -> list[int]:
        url = self._home.setdefault(session, self.urls[len(self._home) % len(self.urls)])
        body = {
            "prompt": ids, "max_tokens": p.max_tokens, "temperature": p.temperature,
            "seed": p.seed, "logprobs": 0, "return_token_ids": True,
        }  # fmt: skip
        r = await self.http.post(f"{url}/v1/completions", json=body)
        r.raise_for_status()
        return list(r.json()["choices"][0]["token_ids"])

    async def close(self) -> None:
        await self.http.aclose()


async def reset_prefix_caches(urls: Sequence[str]) -> None:
    """Empties every server's prefix cache, so runs don't help each other."""
    async with httpx.AsyncClient(timeout=60) as http:
        for u in urls:
            await http.post(f"{u}/reset_prefix_cache")
