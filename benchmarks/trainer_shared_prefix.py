"""Trainer tokens/s with a shared prompt run once per micro-batch vs once per row.

A retool-shaped batch (64 episodes in 8 groups of 8: a 241-token system prompt and
worked examples common to all, 19 task tokens per group, two model turns around a tool
output; ~19k tokens, 12% of them the model's) is trained by two Trainers of the same
model in one process, ``update.share_prefix`` on and off, alternating per round; the
ratio is tokens per CPU-second (one torch thread: the figure other jobs on a shared
machine disturb least). The model has the tiny default model's shape (Qwen2, hidden 128,
4 layers, vocabulary 3,072), with random weights; ``--model DIR`` trains a real one
instead (e.g. SmolLM2-135M: ``agentrl model get smollm2-135m`` prints its directory).

    python -m benchmarks.trainer_shared_prefix [--rounds 3] [--model DIR]
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from agentrl.trainer import Trainer, TrainerConfig
from agentrl.types import Trajectory
from benchmarks.report import report

VOCAB = 3072


def make_model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg)


def retool_batch(
    seed: int, vocab: int = VOCAB, common: int = 241, groups: int = 8, size: int = 8
) -> list[Trajectory]:
    """Episodes shaped like retool's: shared prompt, task, answer, tool output, answer."""
    r, r0 = random.Random(seed), random.Random(0)
    head = [r0.randrange(vocab) for _ in range(common)]
    out = []
    for g in range(groups):
        prompt = head + [r.randrange(vocab) for _ in range(19)]
        for i in range(size):
            turn1 = [r.randrange(vocab) for _ in range(r.randint(15, 35))]
            tool = [r.randrange(vocab) for _ in range(10)]
            turn2 = [r.randrange(vocab) for _ in range(r.randint(5, 15))]
            mask = [0] * len(prompt) + [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2)
            out.append(
                Trajectory(
                    task_id=str(g),
                    group_id=str(g),
                    episode_id=f"{seed}-{g}-{i}",
                    token_ids=prompt + turn1 + tool + turn2,
                    loss_mask=mask,
                    rollout_logprobs=[-2.0 * m for m in mask],
                    weight_versions=[m - 1 for m in mask],
                    reward=float(i % 2),
                )
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", help="a HF model directory (default: random, tiny shape)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = args.model or make_model()
    trainers = {
        share: Trainer(TrainerConfig(update={"share_prefix": share}), model, max_seq_len=1024)
        for share in (False, True)
    }
    vocab = int(trainers[True].policy.lm.config.vocab_size)
    print(f"model: {args.model or 'random, tiny shape'}; {trainers[True].memory_plan}")
    first = retool_batch(0, vocab)
    n = sum(len(t) for t in first)
    print(
        f"batch: {len(first)} episodes, {n} tokens, {sum(t.num_model_tokens for t in first)} model"
    )
    for t in trainers.values():  # warm-up
        t.step(first)
    best: dict[bool, float] = {}
    for r in range(args.rounds):
        batch = retool_batch(r + 1, vocab)
        n = sum(len(t) for t in batch)
        for share, t in trainers.items():
            w0, c0 = time.perf_counter(), time.process_time()
            t.step(batch)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            best[share] = max(best.get(share, 0.0), n / cpu)
            print(
                f"round {r}: share_prefix={share!s:5} {n / cpu:7.0f} tokens/cpu-s "
                f"{n / wall:7.0f} tokens/s wall ({wall:.2f} s a step)"
            )
    ratio = best[True] / best[False]
    print(f"RATIO shared/unshared = {ratio:.2f} (tokens per CPU-second, best round each)")
    report("trainer_shared_prefix_speedup", ratio, unit="x", baseline=best[False])


if __name__ == "__main__":
    main()
