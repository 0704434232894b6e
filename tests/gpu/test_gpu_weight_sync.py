"""NCCL weight sync from a GPU trainer into a running GPU vLLM server, requests in flight.

NCCL cannot put two ranks on one device, so the trainer (GPU 0) and the server (GPU 1)
need two GPUs; with one GPU this test is skipped (the CPU path, /dev/shm + reload,
is covered by tests/integration/test_inference_fleet.py).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl.inference.fleet import Fleet
from agentrl.inference.protocol import SamplingParams
from agentrl.inference.weight_sync import NcclWeightSync
from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.engine.batch import build_batch
from agentrl.trainer.engine.distributed import free_port
from tests.gpu.conftest import need_gpu_vllm, server_config, trajectory

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="NCCL weight sync needs 2 GPUs (trainer + server)"
    ),
]


def _logprobs(
    trainer: Trainer, prompt: list[int], ids: list[int], lps: list[float]
) -> torch.Tensor:
    batch = build_batch([trajectory(prompt, ids, lps)], [0.0], [False])
    with torch.no_grad():
        fo = trainer.forward(trainer.policy.eval(), batch, [0])
    return fo.logp_bR[0, : len(ids)].float().cpu()


async def test_nccl_sync_with_requests_in_flight(tiny_dir, tmp_path) -> None:
    need_gpu_vllm()
    cfg = server_config(
        tiny_dir, tmp_path, gpu_memory_utilization=0.5, env={"CUDA_VISIBLE_DEVICES": "1"},
        extra_args=("--weight-transfer-config", '{"backend": "nccl"}'),
    )  # fmt: skip
    fleet = await Fleet.launch(cfg, num_servers=1)
    trainer = Trainer(
        TrainerConfig.model_validate({"actor": {"dtype": "bfloat16"}}), str(tiny_dir),
        device="cuda:0",
    )  # fmt: skip
    sync = NcclWeightSync(fleet.router, trainer.policy.lm, master_port=free_port(), mode="keep")
    try:
        prompt = [1, 2, 3, 4, 5, 6, 7, 8]
        for seed in range(20):  # a seed whose 3000 tokens hold no EOS on these weights
            long = SamplingParams(max_tokens=3000, temperature=1.0, seed=seed)
            if (await fleet.generate(prompt, long)).finish_reason == "length":
                break
        else:
            pytest.fail("no seed gave 3000 tokens without EOS")
        with torch.no_grad():  # new weights: the trainer's, perturbed
            g = torch.Generator(device="cuda:0").manual_seed(0)
            for p in trainer.policy.lm.parameters():
                p.add_(0.05 * torch.randn(p.shape, device=p.device, generator=g))
        v0 = max(s.weight_version for s in fleet.router.servers)
        task = asyncio.create_task(fleet.generate(prompt, long, session_id="kept"))
        await asyncio.sleep(0.5)
        report = await sync.push()
        kept = await asyncio.wait_for(task, 600)
        assert report.version == v0 + 1
        versions = kept.weight_versions
        assert set(versions) <= {v0, v0 + 1} and versions == sorted(versions)
        assert len(versions) == len(kept.token_ids) > 100
        # New requests run on the pushed weights: the server's logprobs are the trainer's.
        greedy = SamplingParams(max_tokens=48, temperature=0.0)
        after = await fleet.generate(prompt, greedy)
        assert after.weight_versions == [v0 + 1] * len(after.token_ids)
        ours = _logprobs(trainer, prompt, after.token_ids, after.logprobs)
        diff = (ours - torch.tensor(after.logprobs)).abs()
        assert float(diff.mean()) < 0.05, float(diff.mean())
    finally:
        sync.close()
        await fleet.close()
