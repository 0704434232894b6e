"""Minimal GRPO on a multi-turn tool-using env: one training step, top to bottom.

This is the reference for what ``agentrl train`` does in sync mode, with the
trainer written out by hand (no agentrl.trainer): sample G episodes per task on a
vLLM server, score them, turn rewards into group-relative advantages, compute the
clipped policy-gradient loss on the model's own tokens only, step, push the new
weights to the server. Run it:

    python examples/minimal_grpo.py --steps 5

References: GRPO — Shao et al. 2024 (DeepSeekMath), eq. 3; PPO clip — Schulman
et al. 2017, eq. 7; rollout logprobs as π_old ("bypass" mode) — one update per
batch, as in verl's rollout-correction bypass.
"""

from __future__ import annotations

import argparse
import asyncio
import random

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl import SamplingParams, Trajectory
from agentrl.inference.fleet import Fleet
from agentrl.inference.server import ServerConfig
from agentrl.loading.envs import resolve_env
from agentrl.models.tiny import ensure_tiny_model
from agentrl.rollout import AgentLoop, LoopConfig, RolloutRunner

# ----------------------------------------------------------------------------- knobs

TASKS_PER_STEP = 8  # prompts per step
GROUP_SIZE = 8  # G episodes per prompt
LR = 3e-4
CLIP_EPS = 0.2  # PPO ε
MAX_TURNS = 3
MAX_TOKENS_PER_TURN = 128


# ----------------------------------------------------------------------------- 1. rollouts


async def sample_groups(runner: RolloutRunner, tasks: list[dict]) -> list[list[Trajectory]]:
    """G episodes per task. Each trajectory holds the exact token ids, a loss mask
    (1 = sampled by the policy), the sampling logprobs and the reward."""
    result = await runner.run(tasks, seed=random.randrange(1 << 30))
    return result.groups


# ----------------------------------------------------------------------------- 2. advantages


def grpo_advantages(groups: list[list[Trajectory]], eps: float = 1e-6) -> list[float]:
    """A_i = (R_i − mean(R_group)) / (std(R_group) + ε)  (Shao et al. 2024, eq. 3 outcome
    supervision): every token of episode i gets A_i. A group whose rewards are all
    equal carries no signal (A = 0)."""
    adv = []
    for g in groups:
        r = torch.tensor([t.reward for t in g], dtype=torch.float32)
        a = (r - r.mean()) / (r.std(unbiased=False) + eps)
        adv += a.tolist()
    return adv


# ----------------------------------------------------------------------------- 3. batch


def to_tensors(trajs: list[Trajectory], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pads the episodes into [B, T] tensors.

    Token t is predicted from positions < t, so the model's logits at t-1 score
    token t: targets are ids[:, 1:], and their mask / old logprobs shift with them.
    """
    T = max(len(t) for t in trajs)
    B = len(trajs)
    ids_BT = torch.full((B, T), pad_id, dtype=torch.long)
    attn_BT = torch.zeros((B, T), dtype=torch.long)
    mask_BT = torch.zeros((B, T), dtype=torch.float32)
    old_logp_BT = torch.zeros((B, T), dtype=torch.float32)
    for i, t in enumerate(trajs):
        n = len(t)
        ids_BT[i, :n] = torch.tensor(t.token_ids)
        attn_BT[i, :n] = 1
        mask_BT[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        old_logp_BT[i, :n] = torch.tensor(t.rollout_logprobs)
    return {
        "ids": ids_BT,
        "attn": attn_BT,
        "mask": mask_BT[:, 1:],  # [B, T-1]: which targets the policy sampled
        "old_logp": old_logp_BT[:, 1:],
    }


# ----------------------------------------------------------------------------- 4. loss


def token_logprobs(model: torch.nn.Module, ids_BT: torch.Tensor, attn_BT: torch.Tensor):
    """log π(token_t | tokens_<t) for t = 1..T-1, shape [B, T-1]."""
    logits_BTV = model(input_ids=ids_BT, attention_mask=attn_BT).logits[:, :-1].float()
    return torch.log_softmax(logits_BTV, dim=-1).gather(-1, ids_BT[:, 1:, None]).squeeze(-1)


def grpo_loss(logp_BT, old_logp_BT, adv_B, mask_BT) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7), token-mean over sampled tokens:

        ρ_t = exp(log π_θ − log π_old),  L = −mean_t min(ρ_t A, clip(ρ_t, 1−ε, 1+ε) A)

    π_old is the sampling policy (the server's logprobs), so the ratio also
    absorbs any train/inference numerical mismatch.
    """
    ratio_BT = torch.exp(logp_BT - old_logp_BT)
    adv_BT = adv_B[:, None].expand_as(ratio_BT)
    surr1 = ratio_BT * adv_BT
    surr2 = ratio_BT.clamp(1 - CLIP_EPS, 1 + CLIP_EPS) * adv_BT
    per_token = -torch.minimum(surr1, surr2)
    n = mask_BT.sum().clamp(min=1)
    loss = (per_token * mask_BT).sum() / n
    clipped = ((surr2 < surr1).float() * mask_BT).sum() / n
    return loss, {"loss": loss.item(), "clip_frac": clipped.item()}


# ----------------------------------------------------------------------------- 5. one step


def train_step(model, optimizer, groups, pad_id: int) -> dict[str, float]:
    trajs = [t for g in groups for t in g]
    adv_B = torch.tensor(grpo_advantages(groups))
    batch = to_tensors(trajs, pad_id)
    model.train()
    logp_BT = token_logprobs(model, batch["ids"], batch["attn"])
    loss, stats = grpo_loss(logp_BT, batch["old_logp"], adv_B, batch["mask"])
    optimizer.zero_grad()
    loss.backward()
    stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    optimizer.step()
    stats["reward_mean"] = sum(t.reward for t in trajs) / len(trajs)
    return stats


# ----------------------------------------------------------------------------- main


async def main(
    steps: int,
    env_spec: str,
    tasks_per_step: int = TASKS_PER_STEP,
    group_size: int = GROUP_SIZE,
    model_dir: str | None = None,
) -> None:
    model_dir = model_dir or str(ensure_tiny_model())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    # --enforce-eager: no torch.compile warm-up, so on a CPU the server starts about a
    # minute sooner (generation speed is the same for a model this small).
    server = ServerConfig(model=model_dir, max_model_len=2048, extra_args=("--enforce-eager",))
    fleet = await Fleet.launch(server, 1)
    try:
        env_cls = resolve_env(env_spec)
        loop = AgentLoop(
            fleet,  # the fleet is an LLMClient: token ids in, token ids + logprobs out
            tokenizer,
            LoopConfig(
                max_turns=MAX_TURNS,
                max_tokens_per_turn=MAX_TOKENS_PER_TURN,
                sampling=SamplingParams(temperature=1.0),
            ),
        )
        runner = RolloutRunner(loop, env_cls, group_size=group_size)
        tasks = env_cls.default_tasks(split="train", n=tasks_per_step * steps)
        for step in range(steps):
            groups = await sample_groups(
                runner, tasks[step * tasks_per_step : (step + 1) * tasks_per_step]
            )
            stats = await asyncio.to_thread(
                train_step, model, optimizer, groups, tokenizer.pad_token_id
            )
            # Push the new weights to the server; tokens sampled from now on carry the new version.
            weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            report = await fleet.sync_weights(weights, mode="wait")
            print(
                f"step {step + 1}: "
                + " ".join(f"{k}={v:.4f}" for k, v in stats.items())
                + f" weight_version={report.version}"
            )
    finally:
        await fleet.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--env", default="retool")
    p.add_argument("--tasks-per-step", type=int, default=TASKS_PER_STEP)
    p.add_argument("--group-size", type=int, default=GROUP_SIZE)
    p.add_argument("--model", default=None, help="HF model directory (default: the tiny model)")
    a = p.parse_args()
    asyncio.run(main(a.steps, a.env, a.tasks_per_step, a.group_size, a.model))
