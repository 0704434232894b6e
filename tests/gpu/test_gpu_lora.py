"""LoRA on one GPU: a bf16 Qwen2.5-1.5B-shaped policy with a rank-16 adapter, hot-loaded by
a CUDA vLLM server (``trainer.lora.serve: adapter``), whose logprobs through the adapter
are the trainer's; an adapter-sized sync."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agentrl.inference.fleet import Fleet
from agentrl.inference.protocol import SamplingParams
from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.engine.batch import build_batch
from tests.gpu.conftest import need_gpu_vllm, server_config, trajectory

pytestmark = [pytest.mark.gpu, pytest.mark.asyncio(loop_scope="session")]


async def test_adapter_hot_loaded_on_gpu_serves_the_trainers_policy(qwen15b_dir, tmp_path):
    need_gpu_vllm()
    trainer = Trainer(
        TrainerConfig.model_validate(
            {"actor": {"dtype": "bfloat16"}, "lora": {"rank": 16, "alpha": 32}}
        ),
        str(qwen15b_dir),
        device="cuda:0",
    )
    with torch.no_grad():  # B = 0 would serve the base: give the adapter an update
        g = torch.Generator(device="cuda:0").manual_seed(0)
        for n, p in trainer.policy.named_parameters():
            if "lora_B" in n:
                p.copy_(0.02 * torch.randn(p.shape, device=p.device, generator=g))
    cfg = dataclasses.replace(
        server_config(qwen15b_dir, tmp_path, gpu_memory_utilization=0.3), lora_max_rank=16
    )
    fleet = await Fleet.launch(cfg, 1, api="completions", lora_adapters=True)
    try:
        prompt = list(range(10, 74))
        greedy = SamplingParams(max_tokens=32, temperature=0.0)
        base = await fleet.generate(prompt, greedy)
        assert base.weight_versions == [0] * len(base.token_ids)
        report = await fleet.sync_weights({"policy": trainer.save_adapter(tmp_path / "a1")})
        assert report.num_bytes < 200e6, report  # 18.5M adapter parameters, not 3 GB of model
        after = await fleet.generate(prompt, greedy)
        assert after.weight_versions == [report.version] * len(after.token_ids)
        batch = build_batch([trajectory(prompt, after.token_ids, after.logprobs)], [0.0], [False])
        with torch.no_grad():
            fo = trainer.forward(trainer.policy.eval(), batch, [0])
        ours = fo.logp_bR[0, : len(after.token_ids)].float().cpu()
        diff = (ours - torch.tensor(after.logprobs)).abs()
        assert float(diff.mean()) < 0.05, float(diff.mean())  # bf16 on both sides
    finally:
        await fleet.close()
