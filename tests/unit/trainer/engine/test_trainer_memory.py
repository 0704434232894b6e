"""The trainer's memory model, its "auto" settings, and the invariance of what they choose."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.engine import memory as mem
from agentrl.trainer.engine import sysmem
from agentrl.trainer.engine.actor import chunked_logprobs
from agentrl.trainer.engine.batch import build_batch
from agentrl.trainer.engine.memory import (
    MemoryCoefficients,
    MemoryPlanError,
    ModelShape,
    auto_chunk,
    device_chunk,
    estimate_step,
    model_shape,
    plan_memory,
)
from tests.helpers.trainer import assert_same_update, random_batch, tiny_lm

torch.set_num_threads(2)

GB = 1e9
# A toy shape and round coefficients, so that every byte below can be checked by hand.
TOY = ModelShape(
    params=1000, hidden=2, layers=3, heads=1, kv_heads=1, head_dim=2, intermediate=4, vocab=10
)
COEF = MemoryCoefficients(
    runtime_bytes=100.0,
    act_scale=1.0,
    ckpt_scale=0.5,
    attn_scale=1.0,
    logit_copies=2.0,
    head_grad_copies=1.0,
)
SMOL = ModelShape(134_515_008, 576, 30, 9, 3, 64, 1536, 49152)  # SmolLM2-135M


def test_estimate_counts_each_consumer_by_hand() -> None:
    e = estimate_step(TOY, tokens=8, seq_len=4, checkpointing=False, chunk=5, coef=COEF)
    assert e.static == 16 * 1000  # fp32 weights + grads + 2 AdamW moments
    # per layer and token: 14·H + 2·kv·hd + 4·I = 28 + 4 + 16 = 48 floats, + heads·L = 4
    assert e.activations == 8 * 3 * (48 + 4) * 4
    assert e.logits == 2 * 5 * 10 * 4 + 1 * 10 * 2 * 4  # chunk logits + lm-head grads
    assert e.runtime == 100.0
    assert e.total == 16000 + 4992 + 480 + 100
    ck = estimate_step(TOY, tokens=8, seq_len=4, checkpointing=True, chunk=5, coef=COEF)
    assert ck.activations == 8 * 3 * (0.5 * 48 + 4) * 4
    kl = estimate_step(TOY, tokens=8, seq_len=4, checkpointing=False, chunk=5, coef=COEF,
                       ref_model=True, world=2)  # fmt: skip
    assert kl.static == (16 + 4) * 1000 / 2  # FSDP shards the static part
    assert kl.logits == 400 + 80 / 2


def test_model_shape_counts_parameters_like_torch() -> None:
    lm = tiny_lm()
    s = model_shape(lm)
    assert s.params == sum(p.numel() for p in lm.parameters())
    # The analytic count from the config alone agrees (Qwen2: q/k/v biases are not counted,
    # 0.3% of this tiny model, less for real ones).
    est = ModelShape.from_config(lm.config)
    assert abs(est.params - s.params) / s.params < 0.01
    assert (s.hidden, s.layers, s.vocab, s.kv_heads, s.head_dim) == (64, 2, 128, 2, 16)


def test_auto_chunk_bounds_logits_to_128_mib() -> None:
    assert auto_chunk(49152) == 512  # SmolLM2: 512 × 49152 × 4 B = 96 MiB
    assert auto_chunk(151936) == 128  # Qwen2.5: the floor (74 MiB)
    assert auto_chunk(128) == 4096  # tiny vocab: the ceiling


def test_gpu_chunks_grow_with_memory_up_to_1024_tokens() -> None:
    gib = 2**30
    assert device_chunk(151936, "cpu", 80 * gib) == 128  # CPU: 128 MiB, as before
    assert device_chunk(49152, "cpu", 80 * gib) == 512
    # GPU, 80 GiB: 2% is 1.6 GiB, capped at 1 GiB; 1 GiB / (151,936 × 4 B) = 1,766 -> 1,024.
    assert device_chunk(151936, "cuda", 80 * gib) == 1024
    # 20 GiB: 0.4 GiB / 607,744 B = 706 -> 512.
    assert device_chunk(151936, "cuda", 20 * gib) == 512
    # 49k vocab: 1 GiB would allow 5,461 -> 4,096, but a GPU chunk is at most 1,024.
    assert device_chunk(49152, "cuda", 80 * gib) == 1024
    assert device_chunk(128, "cuda", 80 * gib) == 1024


def _cfg(**kw: object) -> TrainerConfig:
    return TrainerConfig.model_validate(kw)


def test_auto_budget_grows_with_memory_and_turns_checkpointing_on_when_tight() -> None:
    cfg = _cfg()
    small = plan_memory(SMOL, cfg, max_seq_len=1024, available=6 * GB)
    big = plan_memory(SMOL, cfg, max_seq_len=1024, available=20 * GB)
    assert small.gradient_checkpointing and small.token_budget >= 1024
    assert not big.gradient_checkpointing and big.token_budget >= 2048
    assert big.estimate.total <= 0.85 * 20 * GB  # the safety margin is kept
    assert small.logprob_chunk == big.logprob_chunk == 512
    # The chosen budget is the largest that fits (one more token would not), or the cap.
    nxt = estimate_step(SMOL, tokens=small.token_budget + 1, seq_len=1024, checkpointing=True,
                        chunk=512)  # fmt: skip
    assert small.token_budget == mem._MAX_AUTO_BUDGET["cpu"] or nxt.total > 0.85 * 6 * GB
    tight = plan_memory(SMOL, cfg, max_seq_len=1024, available=5 * GB)
    nxt = estimate_step(SMOL, tokens=tight.token_budget + 1, seq_len=1024, checkpointing=True,
                        chunk=512)  # fmt: skip
    assert tight.gradient_checkpointing and 1024 <= tight.token_budget < 2048
    assert nxt.total > 0.85 * 5 * GB


def test_explicit_settings_are_kept_and_checked() -> None:
    cfg = _cfg(update={"token_budget": 1024, "logprob_chunk": 256},
               actor={"gradient_checkpointing": True})  # fmt: skip
    p = plan_memory(SMOL, cfg, max_seq_len=1024, available=20 * GB)
    assert (p.token_budget, p.gradient_checkpointing, p.logprob_chunk) == (1024, True, 256)
    old = _cfg(update={"token_budget": 8192}, actor={"gradient_checkpointing": False})
    with pytest.raises(MemoryPlanError) as e:
        plan_memory(SMOL, old, max_seq_len=1024, available=12 * GB)
    msg = str(e.value)
    assert "trainer.update.token_budget=8192 " in msg and "12.0 GB available" in msg
    assert "set trainer.actor.gradient_checkpointing=true" in msg
    kept = plan_memory(SMOL, old, max_seq_len=1024, available=12 * GB, strict=False)
    assert kept.token_budget == 8192 and "needs" in kept.notes[0]


def test_nothing_fits_names_the_settings() -> None:
    with pytest.raises(MemoryPlanError, match=r"rollout.max_total_tokens=1024 .*kv_cache_gb"):
        plan_memory(SMOL, _cfg(), max_seq_len=1024, available=2 * GB)
    fallback = plan_memory(SMOL, _cfg(), max_seq_len=1024, available=2 * GB, strict=False)
    assert fallback.token_budget == 1024 and fallback.gradient_checkpointing


def test_lora_estimate_counts_the_adapter_not_the_base_by_hand() -> None:
    kw = dict(tokens=8, seq_len=4, checkpointing=False, chunk=5, coef=COEF)
    full = estimate_step(TOY, **kw)  # type: ignore[arg-type]
    lora = estimate_step(TOY, lora_params=20, **kw)  # type: ignore[arg-type]
    assert lora.static == 4 * 1000 + 16 * 20  # frozen fp32 base; the adapter trains
    assert lora.logits == 2 * 5 * 10 * 4  # a frozen lm head has no weight gradient
    assert lora.activations == full.activations  # the tokens still flow through the base
    assert full.total - lora.total == (16000 - 4320) + 1 * 10 * 2 * 4


def test_adapter_parameters_are_rank_times_in_plus_out_of_each_target(tmp_path: Path) -> None:
    from agentrl.trainer.config import LoraConfig
    from agentrl.trainer.engine.lora import count_adapter_params
    from tests.helpers.trainer import tiny_model_dir

    # tiny_lm per layer: q 64→64, k 64→32, v 64→32, o 64→64, gate/up 64→128, down 128→64
    per_layer = (64 + 64) + (64 + 32) + (64 + 32) + (64 + 64) + 2 * (64 + 128) + (128 + 64)
    assert per_layer == 1024
    model = tiny_model_dir(tmp_path / "m")
    assert count_adapter_params(model, LoraConfig(rank=4)) == 4 * per_layer * 2
    qv = LoraConfig(rank=2, target_modules=["q_proj", "v_proj"])
    assert count_adapter_params(tiny_lm(), qv) == 2 * ((64 + 64) + (64 + 32)) * 2
    assert model_shape(model).lora_params(4) == 4 * per_layer * 2  # the analytic count
    # SmolLM2-135M, rank 16 on all seven projections: 4,884,480 (as peft counts them)
    per = (576 + 576) + 2 * (576 + 192) + (576 + 576) + 2 * (576 + 1536) + (1536 + 576)
    assert SMOL.lora_params(16) == 16 * per * 30 == 4_884_480


def test_lora_plan_is_smaller_than_full_by_the_frozen_weights_states() -> None:
    """SmolLM2, rank 16, KL on: LoRA drops 12·P of grads and AdamW moments, the 4·P
    reference copy and the lm-head gradients, and adds 16·L for the adapter."""
    fixed = {"update": {"token_budget": 2048}, "actor": {"gradient_checkpointing": False}}
    full = plan_memory(SMOL, _cfg(kl={"coef": 0.05}, **fixed), max_seq_len=1024,
                       available=40 * GB)  # fmt: skip
    lora_cfg = _cfg(kl={"coef": 0.05}, lora={"rank": 16}, **fixed)
    lora = plan_memory(SMOL, lora_cfg, max_seq_len=1024, available=40 * GB)
    p, a = SMOL.params, 4_884_480
    assert full.estimate.static == 16 * p + 4 * p
    assert lora.estimate.static == 4 * p + 16 * a
    head_grads = 2.0 * SMOL.vocab * SMOL.hidden * 4  # CPU_CALIBRATION.head_grad_copies = 2
    assert full.estimate.total - lora.estimate.total == pytest.approx(
        (20 * p - 4 * p - 16 * a) + head_grads
    )
    assert lora.estimate.activations == full.estimate.activations
    # an exact count (here: q and v only) replaces the all-linear one
    qv = plan_memory(SMOL, lora_cfg, max_seq_len=1024, available=40 * GB, lora_params=1000)
    assert qv.estimate.static == 4 * p + 16 * 1000
    # the "auto" budget has more room with LoRA; at 4 GB only LoRA fits at all
    auto_full = plan_memory(SMOL, _cfg(), max_seq_len=1024, available=5 * GB)
    auto_lora = plan_memory(SMOL, _cfg(lora={"rank": 16}), max_seq_len=1024, available=5 * GB)
    assert auto_full.token_budget < auto_lora.token_budget
    with pytest.raises(MemoryPlanError):
        plan_memory(SMOL, _cfg(), max_seq_len=1024, available=4 * GB)
    small = plan_memory(SMOL, _cfg(lora={"rank": 16}), max_seq_len=1024, available=4 * GB)
    assert small.token_budget >= 1024


def test_a_lora_trainer_plans_with_its_exact_adapter() -> None:
    cfg = TrainerConfig(lora={"rank": 2, "target_modules": ["q_proj", "v_proj"]})
    t = Trainer(cfg, tiny_lm())
    p = sum(x.numel() for x in tiny_lm().parameters())
    assert t.trainable_params == 2 * ((64 + 64) + (64 + 32)) * 2
    assert t.memory_plan.estimate.static == 4 * p + 16 * t.trainable_params


def test_available_reads_the_cgroup_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "max").write_text("10000000000\n")
    (tmp_path / "cur").write_text("4000000000\n")
    (tmp_path / "meminfo").write_text("MemTotal: 99 kB\nMemAvailable: 20000000 kB\n")
    monkeypatch.setattr(sysmem, "MEMINFO", str(tmp_path / "meminfo"))
    monkeypatch.setattr(sysmem, "CGROUP_FILES", [(str(tmp_path / "max"), str(tmp_path / "cur"))])
    assert sysmem.available_bytes("cpu") == 6_000_000_000  # limit - usage < MemAvailable
    (tmp_path / "max").write_text("max\n")  # no limit: MemAvailable
    assert sysmem.available_bytes("cpu") == 20_000_000 * 1024


def test_chunked_logprobs_equal_unchunked_hand_values() -> None:
    # logits of the one hidden state [1, 0] are [0, ln 2, ln 5]: softmax = [1/8, 2/8, 5/8].
    head = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[0.0, 0.0], [math.log(2), 0.0], [math.log(5), 0.0]]))
    h = torch.tensor([[1.0, 0.0]] * 5, requires_grad=True)
    tgt = torch.tensor([2, 0, 1, 2, 0])
    p = torch.tensor([1 / 8, 2 / 8, 5 / 8])
    want_lp = torch.log(p[tgt])
    want_ent = -(p * p.log()).sum().expand(5)
    grads = []
    for chunk in (1, 2, 5, 4096):
        h.grad = None
        lp, ent = chunked_logprobs(h, head, tgt, chunk=chunk)
        torch.testing.assert_close(lp, want_lp)
        torch.testing.assert_close(ent, want_ent)
        lp.sum().backward()
        grads.append(h.grad.clone())  # type: ignore[union-attr]
    # d log p_t / dh = W_t - Σ_v p_v W_v; first coordinate: ln W_t - (2/8 ln2 + 5/8 ln5).
    mean_w = 2 / 8 * math.log(2) + 5 / 8 * math.log(5)
    want_g0 = torch.tensor([math.log(5), 0.0, math.log(2), math.log(5), 0.0]) - mean_w
    for g in grads:
        torch.testing.assert_close(g[:, 0], want_g0)


def test_auto_budget_does_not_change_the_update() -> None:
    trajs = random_batch(8)
    shape = model_shape(tiny_lm())
    cfg = _cfg(
        optim={"lr": 1e-3}, update={"mini_batches": 2}, actor={"gradient_checkpointing": False}
    )
    # Memory for ~20 tokens a micro-batch (several micro-batches) vs plenty (one).
    room = estimate_step(shape, tokens=20, seq_len=14, checkpointing=False, chunk=4096).total
    tight = Trainer(cfg, tiny_lm(), max_seq_len=14, available_memory=room / 0.85)
    roomy = Trainer(cfg, tiny_lm(), max_seq_len=14, available_memory=100 * GB)
    assert 14 <= tight.token_budget <= 20 < roomy.token_budget
    b = build_batch(trajs, [t.reward for t in trajs], [False] * 8)
    assert len(tight.plan(b, range(8))) >= 3 and len(roomy.plan(b, range(8))) == 1
    _, m_t = assert_same_update(roomy, tight, trajs)
    assert m_t["memory/token_budget"] == tight.token_budget
    assert m_t["perf/peak_rss_gb"] > 0.05  # this process's high-water mark, in GB


def test_auto_checkpointing_does_not_change_the_update() -> None:
    trajs = random_batch(6)
    shape = model_shape(tiny_lm())
    room = estimate_step(shape, tokens=20, seq_len=14, checkpointing=False, chunk=4096).total
    cfg = _cfg(optim={"lr": 1e-3})
    ck = Trainer(cfg, tiny_lm(), max_seq_len=14, available_memory=room / 0.85)
    plain = Trainer(cfg, tiny_lm(), max_seq_len=14, available_memory=100 * GB)
    assert ck.gradient_checkpointing and not plain.gradient_checkpointing
    assert_same_update(plain, ck, trajs)


def test_fsdp_always_shards_one_worker_with_the_same_update() -> None:
    """actor.fsdp='always' (the GPU tier's one-GPU FSDP2 step) on CPU/gloo, world size 1."""
    import torch.distributed as dist

    from agentrl.trainer.engine.distributed import free_port

    trajs = random_batch(6)
    cfg = _cfg(optim={"lr": 1e-3}, actor={"fsdp": "always"})
    plain = Trainer(cfg, tiny_lm())  # no process group: not sharded
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        sharded = Trainer(cfg, tiny_lm())
        assert all(hasattr(p, "full_tensor") for p in sharded.policy.parameters())
        assert not any(hasattr(p, "full_tensor") for p in plain.policy.parameters())
        m_p, m_s = plain.step(trajs), sharded.step(trajs)
        full = {k: v.full_tensor().detach() for k, v in sharded.policy.named_parameters()}
    finally:
        dist.destroy_process_group()
    assert m_s["actor/grad_norm"] == pytest.approx(m_p["actor/grad_norm"], rel=1e-6)
    for k, v in plain.policy.named_parameters():
        torch.testing.assert_close(full[k], v.detach(), atol=1e-6, rtol=0)


def test_mfu_helpers_by_hand() -> None:
    from agentrl.trainer.engine.metrics import mfu, train_flops_per_token

    # 6·N + 12·layers·heads·head_dim·L = 600 + 12·2·3·4·10
    assert train_flops_per_token(100, 2, 3, 4, 10.0) == 600 + 2880
    assert mfu(1000.0, 989e6, "NVIDIA H100 80GB HBM3") == pytest.approx(1e-3)
    assert mfu(1000.0, 1e9, "Some CPU") is None
