"""Trainer tokens/s: token-budget micro-batches vs fixed-size padded micro-batches.

A batch of strongly skewed episode lengths (most short, a few ~16× longer) is trained
with the same Trainer and model twice per round, once per strategy, in one process;
the printed ratio is tokens/s(token budget) / tokens/s(fixed, padded).

With one torch thread (the default) tokens per CPU-second of the process equals tokens/s
on an idle core; on a shared machine it is the figure other jobs cannot disturb, so the
ratio uses it (wall-clock tokens/s is printed too).

    python -m benchmarks.trainer_microbatch [--rounds 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from agentrl.trainer import Trainer, TrainerConfig
from agentrl.types import Trajectory
from benchmarks.report import report


def make_model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
    )
    return Qwen2ForCausalLM(cfg)


def skewed_batch(n: int = 48, n_long: int = 4, seed: int = 0) -> list[Trajectory]:
    """n episodes: n_long of ~1000 tokens, the rest 40-100 tokens; prompts of 16 tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        resp = 1000 if i % (n // n_long) == 0 else int(torch.randint(24, 84, (1,), generator=g))
        total = 16 + resp
        ids = torch.randint(0, 2048, (total,), generator=g).tolist()
        out.append(
            Trajectory(
                task_id=str(i // 8),
                group_id=str(i // 8),
                episode_id=str(i),
                token_ids=ids,
                loss_mask=[0] * 16 + [1] * resp,
                rollout_logprobs=[0.0] * 16 + [-7.0] * resp,
                weight_versions=[-1] * 16 + [0] * resp,
                reward=float(i % 2),
            )
        )
    return out


def run(trainer: Trainer, batch: list[Trajectory]) -> tuple[float, float]:
    """(tokens per wall second, tokens per CPU second of this process)."""
    w0, c0 = time.perf_counter(), time.process_time()
    trainer.step(batch)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    n = sum(len(t) for t in batch)
    return n / wall, n / cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    batch = skewed_batch()
    lengths = sorted(len(t) for t in batch)
    print(
        f"batch: {len(batch)} episodes, {sum(lengths)} tokens, lengths {lengths[0]}..{lengths[-1]}"
    )
    base = {"optim": {"lr": 1e-5}, "correction": {"mode": "decoupled"}}
    variants = {
        "token_budget (2048, sorted padded)": {
            "strategy": "token_budget", "token_budget": 2048, "packing": False
        },
        "token_budget (2048, packed)": {
            "strategy": "token_budget", "token_budget": 2048, "packing": True
        },
        "fixed (4 padded rows)": {"strategy": "fixed", "micro_batch_size": 4},
    }  # fmt: skip
    model = make_model()
    trainers = {k: Trainer(TrainerConfig(**base, update=v), model) for k, v in variants.items()}
    for t in trainers.values():  # warm-up
        t.step(batch[:8])
    best: dict[str, float] = {}
    for r in range(args.rounds):
        for name, t in trainers.items():
            wall_tps, cpu_tps = run(t, batch)
            best[name] = max(best.get(name, 0.0), cpu_tps)
            print(
                f"round {r}: {name:36s} {cpu_tps:7.0f} tokens/cpu-s  {wall_tps:7.0f} tokens/s wall"
            )
    fixed = best["fixed (4 padded rows)"]
    for name, tps in best.items():
        print(f"{name:36s} best {tps:7.0f} tokens/cpu-s  ×{tps / fixed:.2f} vs fixed padded")
    # On CPU (sdpa) the trainer's default is the sorted-padded layout; packing needs varlen
    # flash attention (GPU) to avoid attending across the episodes of a packed row.
    ratio = best["token_budget (2048, sorted padded)"] / fixed
    print(f"RATIO token_budget/fixed = {ratio:.2f} (target ≥ 1.5)")
    report("token_budget_over_fixed_tokens_per_s", ratio, target=1.5, unit="x", baseline=fixed)


if __name__ == "__main__":
    main()
