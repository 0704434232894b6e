"""Checkpoints: resume reproduces the uninterrupted run; saves are atomic; HF export loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.engine.checkpoint import resolve_checkpoint
from tests.helpers.trainer import random_batch, tiny_lm, tiny_model_dir

torch.set_num_threads(2)


def _cfg(tmp: Path) -> TrainerConfig:
    # Warm-up + decay, adaptive KL (reference model), 2 epochs × 2 mini-batches with shuffling:
    # every piece of state matters for the next step.
    return TrainerConfig(
        seed=3,
        optim={"lr": 1e-3, "warmup_steps": 2, "schedule": "cosine", "total_steps": 20},
        kl={"coef": 0.05, "adaptive": True, "target": 0.01, "horizon": 10},
        update={"epochs": 2, "mini_batches": 2},
        checkpoint={"dir": str(tmp / "ckpt"), "keep_last": 2},
    )


def test_resume_reproduces_the_next_step(tmp_path: Path) -> None:
    b1, b2, b3 = random_batch(6, seed=1), random_batch(6, seed=2), random_batch(6, seed=3)
    model = tiny_lm()
    straight = Trainer(_cfg(tmp_path), model)
    straight.step(b1)
    straight.step(b2)
    m_straight = straight.step(b3)

    first = Trainer(_cfg(tmp_path), model)
    first.step(b1)
    first.step(b2)
    path = first.save_checkpoint(extra={"data_position": 12})
    assert path.name == "step_2"
    resumed = Trainer(_cfg(tmp_path), tiny_lm(seed=99))  # different init: all must come from disk
    extra = resumed.load_checkpoint(tmp_path / "ckpt")
    assert extra == {"data_position": 12}
    assert resumed.global_step == 2 and resumed.kl_ctl.value == first.kl_ctl.value
    m_resumed = resumed.step(b3)
    assert m_resumed["optim/lr"] == m_straight["optim/lr"]
    assert m_resumed["kl/coef"] == pytest.approx(m_straight["kl/coef"])
    a, b = straight.state_dict_for_inference(), resumed.state_dict_for_inference()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0)


def test_crash_mid_save_keeps_last_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = Trainer(_cfg(tmp_path), tiny_lm())
    t.step(random_batch(4))
    good = t.save_checkpoint()
    t.step(random_batch(4))
    real_save = torch.save

    def crash(obj, f, *a, **kw):
        if str(getattr(f, "name", f)).endswith("trainer_state.pt"):
            raise OSError("disk full")
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        t.save_checkpoint()
    monkeypatch.undo()
    root = tmp_path / "ckpt"
    assert resolve_checkpoint(root) == good
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp")]
    fresh = Trainer(_cfg(tmp_path), tiny_lm())
    fresh.load_checkpoint(root)
    assert fresh.global_step == 1


def test_keep_last_prunes_old_checkpoints(tmp_path: Path) -> None:
    t = Trainer(_cfg(tmp_path), tiny_lm())
    for _ in range(3):
        t.step(random_batch(4))
        t.save_checkpoint()
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("step_"))
    assert names == ["step_2", "step_3"]


def test_save_hf_loads_in_transformers(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    src = tiny_model_dir(tmp_path / "src")
    t = Trainer(TrainerConfig(optim={"lr": 1e-2}), src)
    t.step(random_batch(4))
    out = t.save_hf(tmp_path / "export")
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert list(out.glob("*.safetensors"))
    loaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    sd = t.state_dict_for_inference()
    assert "model.embed_tokens.weight" in sd and not any(k.startswith("lm.") for k in sd)
    for k, v in sd.items():
        torch.testing.assert_close(loaded.state_dict()[k], v)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, t.policy.lm(input_ids=ids).logits)
