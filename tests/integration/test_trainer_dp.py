"""Data parallelism: 2 FSDP2 workers (gloo, CPU) make the same update as 1 process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.trainer import DataParallelTrainer, Trainer, TrainerConfig
from tests.helpers.trainer import random_batch, tiny_model_dir

pytestmark = pytest.mark.integration


def test_two_workers_match_one_worker(tmp_path: Path) -> None:
    src = tiny_model_dir(tmp_path / "model")
    cfg = TrainerConfig(
        optim={"lr": 1e-3},
        update={"mini_batches": 2, "epochs": 2, "token_budget": 12},
        loss={"clip_low": 0.1, "clip_high": 0.1},
    )
    big, small = random_batch(8, seed=1), random_batch(3, seed=5)  # 3 rows: a worker idles
    torch.set_num_threads(2)
    single = Trainer(cfg, src)
    p0 = single.state_dict_for_inference()
    s1 = single.step(big)
    single.step(small)
    expected = single.state_dict_for_inference()

    with DataParallelTrainer(cfg, src, world_size=2, backend="gloo") as dp:
        d1 = dp.step(big)
        dp.step(small)
        got = dp.state_dict_for_inference()
        ckpt = dp.save_checkpoint(tmp_path / "ckpt", extra={"pos": 2})
        out = dp.save_hf(tmp_path / "hf")

    assert d1["actor/grad_norm"] == pytest.approx(s1["actor/grad_norm"], rel=1e-5)
    assert d1["loss/policy"] == pytest.approx(s1["loss/policy"], rel=1e-5, abs=1e-7)
    assert d1["batch/model_tokens"] == s1["batch/model_tokens"]
    assert max(float((expected[k] - p0[k]).abs().max()) for k in p0) > 1e-3
    assert set(got) == set(expected)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], atol=1e-4, rtol=0)

    # The data-parallel checkpoint resumes in a single process, and the export loads.
    resumed = Trainer(cfg, src)
    assert resumed.load_checkpoint(ckpt) == {"pos": 2}
    assert resumed.global_step == 2
    for k, v in resumed.state_dict_for_inference().items():
        torch.testing.assert_close(v, got[k])
    assert (out / "config.json").is_file() and list(out.glob("*.safetensors"))
