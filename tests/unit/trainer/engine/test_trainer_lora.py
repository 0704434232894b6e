"""trainer.lora: a peft adapter over a frozen base; merged weights out; adapter-only state."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from agentrl.errors import TrainerSetupError
from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.engine.checkpoint import CheckpointError
from agentrl.types import Trajectory
from tests.helpers.trainer import (
    VOCAB,
    assert_same_update,
    episode,
    random_batch,
    tiny_lm,
    tiny_model_dir,
)

torch.set_num_threads(2)

# Per layer of tiny_lm, r·(in + out) over q 64→64, k 64→32, v 64→32, o 64→64,
# gate 64→128, up 64→128, down 128→64 = 1024·r; two layers.
ADAPTER_PARAMS_PER_RANK = 2 * 1024


def _lora(**kw: object) -> TrainerConfig:
    base: dict[str, object] = {"optim": {"lr": 1e-2}, "lora": {"rank": 4}}
    return TrainerConfig(**{**base, **kw})


def _frozen(t: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in t.policy.named_parameters() if not p.requires_grad}


def _adapter(t: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in t.policy.named_parameters() if "lora_" in n}


def test_off_by_default_and_unknown_keys_are_errors() -> None:
    assert TrainerConfig().lora is None
    with pytest.raises(ValueError, match="ranks"):
        TrainerConfig(lora={"ranks": 4})
    with pytest.raises(ValueError, match="target_modules is empty"):
        TrainerConfig(lora={"target_modules": []})


def test_optimizer_holds_only_the_adapter() -> None:
    t = Trainer(_lora(), tiny_lm())
    opt = [p for g in t.optimizer.param_groups for p in g["params"]]
    names = {id(p): n for n, p in t.policy.named_parameters()}
    assert all("lora_" in names[id(p)] for p in opt)
    assert sum(p.numel() for p in opt) == 4 * ADAPTER_PARAMS_PER_RANK
    m = t.step(random_batch(6))
    assert m["lora/trainable_params"] == 4 * ADAPTER_PARAMS_PER_RANK
    assert "lora/trainable_params" not in Trainer(TrainerConfig(), tiny_lm()).step(random_batch(4))


def test_a_step_moves_the_adapter_and_not_the_base() -> None:
    t = Trainer(_lora(), tiny_lm())
    base0, ad0 = _frozen(t), _adapter(t)
    t.step(random_batch(6))
    base1, ad1 = _frozen(t), _adapter(t)
    assert base0.keys() == base1.keys() and len(base0) > 10
    for k in base0:
        assert torch.equal(base0[k], base1[k]), k
    moved = {k for k in ad0 if not torch.equal(ad0[k], ad1[k])}
    assert moved == {k for k in ad0 if "lora_B" in k}  # B = 0 at the start: A's grad is 0
    t.step(random_batch(6, seed=2))
    assert all(not torch.equal(ad0[k], v) for k, v in _adapter(t).items())
    assert all(torch.equal(base0[k], v) for k, v in _frozen(t).items())


def test_reference_is_the_base_with_the_adapter_off_and_no_second_copy() -> None:
    trajs = random_batch(6)
    t = Trainer(_lora(kl={"coef": 0.1}), tiny_lm())
    assert t.ref is not None and list(t.ref.parameters()) == []
    lms = [m for m in t.policy.modules() if type(m).__name__ == "Qwen2ForCausalLM"]
    assert len(lms) == 1  # the policy's LM is the only model
    t.step(trajs)
    t.step(trajs)  # the adapter is now far from zero
    from agentrl.trainer.engine.batch import build_batch

    batch = build_batch(trajs, [0.0] * len(trajs), [False] * len(trajs))
    pre = t.prepass(batch, need_old=True)
    base = Trainer(TrainerConfig(), tiny_lm())  # full fine-tuning, untrained: the base
    base_logp = base.prepass(batch, need_old=True)["old_logp"]
    torch.testing.assert_close(pre["ref_logp"], base_logp, atol=1e-5, rtol=0)
    assert float((pre["old_logp"] - pre["ref_logp"]).abs().max()) > 1e-3  # adapter on ≠ off
    assert t.policy.training  # the reference's eval() did not stick to the policy
    assert any(p.requires_grad for p in t.policy.parameters())


def test_merged_weights_load_as_the_base_model_and_match_the_adapted_logits(
    tmp_path: Path,
) -> None:
    t = Trainer(_lora(lora={"rank": 4, "alpha": 16}), tiny_lm())
    t.step(random_batch(6))
    sd = t.state_dict_for_inference()
    full = Trainer(TrainerConfig(), tiny_lm()).state_dict_for_inference()
    assert sd.keys() == full.keys()  # HF names, no base_layer / lora_ entries
    assert any(not torch.equal(sd[k], full[k]) for k in sd)  # the adapter is merged in
    out = t.save_hf(tmp_path / "merged")
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    t.policy.eval()
    with torch.no_grad():
        want = t.lora(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_adapter_alone_loads_with_peft(tmp_path: Path) -> None:
    from peft import PeftModel

    t = Trainer(_lora(), tiny_lm())
    t.step(random_batch(6))
    state = t.adapter_state_for_inference()
    assert state and all("lora_" in k for k in state)
    assert sum(v.numel() for v in state.values()) == 4 * ADAPTER_PARAMS_PER_RANK
    out = t.save_adapter(tmp_path / "adapter")
    assert {p.name for p in out.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    loaded = PeftModel.from_pretrained(tiny_lm(), str(out)).eval()
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    t.policy.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=ids).logits, t.lora(input_ids=ids).logits, atol=1e-5, rtol=0
        )
    with pytest.raises(ValueError, match=r"set trainer.lora"):
        Trainer(TrainerConfig(), tiny_lm()).save_adapter(tmp_path / "none")


def _ckpt_cfg(tmp: Path, **lora: object) -> TrainerConfig:
    return TrainerConfig(
        seed=3,
        optim={"lr": 1e-3, "warmup_steps": 2, "schedule": "cosine", "total_steps": 20},
        kl={"coef": 0.05, "adaptive": True, "target": 0.01, "horizon": 10},
        update={"epochs": 2, "mini_batches": 2},
        checkpoint={"dir": str(tmp / "ckpt"), "keep_last": 2},
        lora={"rank": 4, "dropout": 0.1, **lora},  # dropout: the RNG state matters too
    )


def test_checkpoint_holds_the_adapter_only_and_resumes_exactly(tmp_path: Path) -> None:
    b1, b2, b3 = random_batch(6, seed=1), random_batch(6, seed=2), random_batch(6, seed=3)
    straight = Trainer(_ckpt_cfg(tmp_path), tiny_lm())
    straight.step(b1)
    straight.step(b2)
    m_straight = straight.step(b3)

    first = Trainer(_ckpt_cfg(tmp_path), tiny_lm())
    first.step(b1)
    first.step(b2)
    path = first.save_checkpoint()
    saved = torch.load(path / "model_policy.pt", weights_only=True)
    assert saved and all("lora_" in k for k in saved)  # no frozen base
    assert sum(v.numel() for v in saved.values()) == 4 * ADAPTER_PARAMS_PER_RANK
    assert not (path / "model_ref.pt").exists()
    resumed = Trainer(_ckpt_cfg(tmp_path), tiny_lm())  # a fresh adapter: it must come from disk
    resumed.load_checkpoint(tmp_path / "ckpt")
    m_resumed = resumed.step(b3)
    assert m_resumed["actor/grad_norm"] == m_straight["actor/grad_norm"]
    assert m_resumed["kl/coef"] == m_straight["kl/coef"]
    a, b = _adapter(straight), _adapter(resumed)
    for k in a:
        assert torch.equal(a[k], b[k]), k  # bit-identical

    full = Trainer(TrainerConfig(checkpoint={"dir": str(tmp_path / "ckpt")}), tiny_lm())
    with pytest.raises(CheckpointError, match=r"holds a LoRA adapter; set trainer\.lora"):
        full.load_checkpoint(tmp_path / "ckpt")
    other = _ckpt_cfg(tmp_path, target_modules=["q_proj"])
    with pytest.raises(CheckpointError, match="the adapter has parameters this model lacks"):
        Trainer(other, tiny_lm()).load_checkpoint(tmp_path / "ckpt")
    rank8 = _ckpt_cfg(tmp_path, rank=8)
    with pytest.raises(CheckpointError, match=r"does not fit .*trainer\.lora\.rank"):
        Trainer(rank8, tiny_lm()).load_checkpoint(tmp_path / "ckpt")


def test_a_module_the_model_lacks_names_the_ones_it_has() -> None:
    with pytest.raises(TrainerSetupError) as e:
        Trainer(_lora(lora={"target_modules": ["q_proj", "query"]}), tiny_lm())
    msg = str(e.value)
    assert "'query' is not a linear layer of Qwen2ForCausalLM's decoder" in msg
    assert "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj" in msg
    with pytest.raises(TrainerSetupError, match="'lm_head' is not a linear layer"):
        Trainer(_lora(lora={"target_modules": ["lm_head"]}), tiny_lm())
    t = Trainer(_lora(lora={"rank": 2, "target_modules": ["self_attn.q_proj"]}), tiny_lm())
    assert t.trainable_params == 2 * 2 * (64 + 64)  # two layers' q_proj


def test_missing_peft_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(TrainerSetupError, match=r"pip install 'agentrl\[lora\]'"):
        Trainer(_lora(), tiny_lm())


def test_sharded_workers_are_refused_naming_the_setting() -> None:
    from agentrl.trainer.engine.networks import build_networks

    with pytest.raises(TrainerSetupError, match=r"FSDP2-sharded.*unset trainer\.lora"):
        build_networks(
            _lora(), tiny_lm(), torch.device("cpu"), world=2,
            gradient_checkpointing=False, logprob_chunk=64,
        )  # fmt: skip
    with pytest.raises(TrainerSetupError, match=r"pissa.*trainer\.kl\.ref_model_path"):
        Trainer(_lora(lora={"init": "pissa", "serve": "merged"}, kl={"coef": 0.1}), tiny_lm())


@pytest.mark.parametrize("init", ["gaussian", "pissa"])
def test_other_inits_start_at_the_base_model(init: str) -> None:
    t = Trainer(_lora(lora={"rank": 4, "init": init, "serve": "merged"}), tiny_lm())
    base = Trainer(TrainerConfig(), tiny_lm()).state_dict_for_inference()
    for k, v in t.state_dict_for_inference().items():
        torch.testing.assert_close(v, base[k], atol=1e-5, rtol=0)
    assert any(float(p.abs().max()) > 0 for n, p in _adapter(t).items() if "lora_A" in n)


def test_checkpointing_and_micro_batches_do_not_change_the_update() -> None:
    trajs = random_batch(8)
    # One mini-batch: Adam's first step on B = 0 is lr·sign(g), so with two mini-batches the
    # float noise of a different summation order flips the sign of near-zero gradient
    # elements and the second mini-batch starts from other weights (up to 2·lr apart).
    upd = {"mini_batches": 1, "epochs": 2}
    ref = Trainer(
        _lora(update={**upd, "token_budget": 10_000}, actor={"gradient_checkpointing": False}),
        tiny_lm(),
    )
    alt = Trainer(
        _lora(update={**upd, "token_budget": 12}, actor={"gradient_checkpointing": True}),
        tiny_lm(),
    )
    assert alt.gradient_checkpointing and not ref.gradient_checkpointing
    assert_same_update(ref, alt, trajs)
    fixed = Trainer(_lora(update={**upd, "strategy": "fixed", "micro_batch_size": 1}), tiny_lm())
    again = Trainer(_lora(update={**upd, "token_budget": 10_000}), tiny_lm())
    assert_same_update(again, fixed, trajs)


def _shared(n: int = 8, common: int = 30) -> list[Trajectory]:
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, VOCAB, (common,), generator=g).tolist()
    out = []
    for i in range(n):
        tail = torch.randint(0, VOCAB, (2 + i % 3,), generator=g).tolist()
        resp = torch.randint(0, VOCAB, (3 + i % 4,), generator=g).tolist()
        out.append(episode(i, f"g{i // 4}", prompt + tail, resp, float(i % 2)))
    return out


def test_shared_prefix_gives_the_same_update() -> None:
    trajs = _shared()
    cfg = {"correction": {"mode": "decoupled"}, "kl": {"coef": 0.1}}
    ref = Trainer(_lora(**cfg, update={"share_prefix": False}), tiny_lm())
    alt = Trainer(_lora(**cfg, update={"share_prefix": True}), tiny_lm())
    _, m_alt = assert_same_update(ref, alt, trajs)
    assert m_alt["perf/shared_prefix_tokens"] > 0


def test_value_head_is_trained_beside_the_adapter_and_the_reference_gives_no_values() -> None:
    t = Trainer(_lora(advantage={"estimator": "gae"}, kl={"coef": 0.1}), tiny_lm())
    assert t.policy.value_head is not None
    opt = {id(p) for g in t.optimizer.param_groups for p in g["params"]}
    assert all(id(p) in opt for p in t.policy.value_head.parameters())
    assert t.trainable_params == 4 * ADAPTER_PARAMS_PER_RANK + 65
    head0 = t.policy.value_head.weight.detach().clone()
    m = t.step(random_batch(6))
    m = t.step(random_batch(6, seed=4))
    assert not torch.equal(head0, t.policy.value_head.weight)
    assert m["critic/explained_variance"] == m["critic/explained_variance"]  # finite, not nan
    from agentrl.trainer.engine.batch import build_batch

    trajs = random_batch(6, seed=7)
    batch = build_batch(trajs, [0.0] * len(trajs), [False] * len(trajs))
    with_ref = t.prepass(batch, need_old=True)
    t.ref = None
    alone = t.prepass(batch, need_old=True)
    assert float(alone["values"].abs().max()) > 0
    assert torch.equal(with_ref["values"], alone["values"])  # the reference wrote none


def test_model_directory_and_between_step_memory(tmp_path: Path) -> None:
    t = Trainer(_lora(), tiny_model_dir(tmp_path / "m"))
    m = t.step(random_batch(4))
    assert 0 < m["perf/rss_between_steps_gb"] <= m["perf/peak_rss_gb"]
    out = t.save_hf(tmp_path / "hf")
    assert (out / "tokenizer_config.json").is_file()
