"""bf16 trainer steps on one GPU: FSDP2-sharded vs plain, and a Qwen2.5-1.5B-shaped model."""

from __future__ import annotations

import math
import time

import pytest
import torch
import torch.distributed as dist

from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.engine.distributed import free_port
from agentrl.trainer.engine.memory import available_bytes
from tests.gpu.conftest import QWEN15B_SHAPE, random_episodes

pytestmark = pytest.mark.gpu


def _full(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in module.named_parameters():
        full = getattr(v, "full_tensor", None)
        out[k] = (full() if full is not None else v).detach().float().cpu()
    return out


def test_bf16_fsdp2_step_on_one_gpu_matches_unsharded(tiny_dir) -> None:
    trajs = random_episodes(8, 96, vocab=256)
    cfg = TrainerConfig.model_validate(
        {"optim": {"lr": 1e-3}, "actor": {"dtype": "bfloat16", "fsdp": "always"}}
    )
    plain = Trainer(cfg, str(tiny_dir), device="cuda:0")
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        sharded = Trainer(cfg, str(tiny_dir), device="cuda:0")
        assert all(hasattr(p, "full_tensor") for p in sharded.policy.parameters())  # DTensors
        p0 = _full(plain.policy)
        m_plain, m_sharded = plain.step(trajs), sharded.step(trajs)
        a, b = _full(plain.policy), _full(sharded.policy)
    finally:
        dist.destroy_process_group()
    assert math.isfinite(m_sharded["actor/grad_norm"])
    assert m_sharded["actor/grad_norm"] == pytest.approx(m_plain["actor/grad_norm"], rel=2e-2)
    # AdamW's first step moves each weight by ±lr (sign of its gradient): the two updates
    # agree where the gradients' signs do, i.e. everywhere but at near-zero gradients.
    agree = total = 0
    for k in a:
        da, db = a[k] - p0[k], b[k] - p0[k]
        agree += int(((da - db).abs() < 1e-4).sum())
        total += da.numel()
    assert max(float((a[k] - p0[k]).abs().max()) for k in a) > 5e-4  # the update is real
    assert agree / total > 0.99, agree / total
    assert 0.0 < m_sharded["perf/peak_gpu_gb"] < 80.0


def test_qwen15b_shaped_model_trains_in_bf16_within_its_memory_plan(qwen15b_dir) -> None:
    """The automatic plan fits a 1.5B model on the GPU, and the measured peak stays under it."""
    cfg = TrainerConfig.model_validate({"optim": {"lr": 1e-6}, "actor": {"dtype": "bfloat16"}})
    avail = available_bytes("cuda:0")
    trainer = Trainer(cfg, str(qwen15b_dir), device="cuda:0", max_seq_len=1024)
    plan = trainer.memory_plan
    # GPU: chunks of 2% of the memory (≤ 1 GiB of logits), not the CPU's 128 MiB.
    assert plan.token_budget >= 1024 and plan.logprob_chunk >= 512
    trajs = random_episodes(16, 1024, vocab=QWEN15B_SHAPE["vocab_size"])
    trainer.step(trajs[:2])  # AdamW moments are created in the first step
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    m = trainer.step(trajs)
    wall = time.perf_counter() - t0
    assert math.isfinite(m["actor/grad_norm"]) and math.isfinite(m["loss/policy"])
    assert m["perf/peak_gpu_gb"] * 1e9 < avail
    # MFU is reported for bf16 on a GPU of known peak (H100/H200/A100...), and is a fraction.
    assert 0.0 < m["perf/mfu"] < 1.0, m.get("perf/mfu")
    print(
        f"qwen2.5-1.5b shape: budget {plan.token_budget}, ckpt {plan.gradient_checkpointing}, "
        f"estimated {plan.estimate.total / 1e9:.1f} GB, peak {m['perf/peak_gpu_gb']:.1f} GB, "
        f"{16 * 1024 / wall:.0f} tokens/s, MFU {m['perf/mfu']:.1%} "
        f"({torch.cuda.get_device_name(0)})"
    )
