"""A vLLM server on the GPU: launch, token round trip, and bf16 logprob parity with the trainer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from agentrl.inference.protocol import SamplingParams
from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.engine.batch import build_batch
from tests.gpu.conftest import trajectory

pytestmark = [pytest.mark.gpu, pytest.mark.asyncio(loop_scope="session")]


def _prompt(model_dir: Path, text: str) -> list[int]:
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(tok.encode(rendered, add_special_tokens=False))


async def test_gpu_server_launches_and_generates_with_versions(gpu_fleet, tiny_dir) -> None:
    free, total = torch.cuda.mem_get_info(0)
    # The server holds its share of GPU memory (gpu_memory_utilization=0.25).
    assert total - free > 0.2 * total
    prompt = _prompt(tiny_dir, "Compute 12 + 30.")
    g = await gpu_fleet.generate(prompt, SamplingParams(max_tokens=32, temperature=1.0, seed=1))
    assert 0 < len(g.token_ids) <= 32 and len(g.logprobs) == len(g.token_ids)
    assert all(math.isfinite(x) and x <= 0.0 for x in g.logprobs)
    assert g.weight_versions == [gpu_fleet.weight_version] * len(g.token_ids)
    again = await gpu_fleet.generate(prompt, SamplingParams(max_tokens=32, temperature=1.0, seed=1))
    assert again.token_ids == g.token_ids  # seeded sampling is reproducible


async def test_bf16_trainer_logprobs_match_vllm(gpu_fleet, tiny_dir) -> None:
    """π_old recomputed by the bf16 trainer ≈ the server's sampling logprobs (same weights)."""
    prompt = _prompt(tiny_dir, "What is 7 times 6?")
    gens = [
        await gpu_fleet.generate(prompt, SamplingParams(max_tokens=128, temperature=1.0, seed=s))
        for s in range(4)
    ]
    trajs = [trajectory(prompt, g.token_ids, g.logprobs, i) for i, g in enumerate(gens)]
    cfg = TrainerConfig.model_validate({"actor": {"dtype": "bfloat16"}})
    trainer = Trainer(cfg, str(tiny_dir), device="cuda:0", max_seq_len=len(prompt) + 128)
    batch = build_batch(trajs, [0.0] * 4, [False] * 4)
    with torch.no_grad():
        fo = trainer.forward(trainer.policy.eval(), batch, list(range(4)))
    mask = batch.mask_BR[:, : fo.logp_bR.shape[1]] > 0
    ours = fo.logp_bR.float().cpu()[mask]
    theirs = batch.rollout_logp_BR[:, : fo.logp_bR.shape[1]][mask]
    diff = (ours - theirs).abs()
    # bf16 on both sides, different kernels: small per-token differences, no bias.
    assert float(diff.mean()) < 0.02, float(diff.mean())
    assert float(diff.max()) < 0.25, float(diff.max())
    assert abs(float((ours - theirs).mean())) < 0.01


async def test_qwen15b_shaped_model_serves_on_gpu(qwen15b_dir, tmp_path) -> None:
    from agentrl.inference.fleet import Fleet
    from tests.gpu.conftest import need_gpu_vllm, server_config

    need_gpu_vllm()
    fleet = await Fleet.launch(server_config(qwen15b_dir, tmp_path, gpu_memory_utilization=0.3))
    try:
        prompt = _prompt(qwen15b_dir, "Hello")
        g = await fleet.generate(prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=0))
        assert len(g.token_ids) == len(g.logprobs) > 0
        assert all(0 <= t < 151936 for t in g.token_ids)
        assert all(math.isfinite(x) for x in g.logprobs)
    finally:
        await fleet.close()
