"""The run's start-up memory check: "auto" resolved for a 24 GB machine, bad configs named."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config import RunConfig
from agentrl.orchestration import trainer_memory as tm
from agentrl.orchestration.startup import ComponentError

MACHINE = 22.5e9  # MemAvailable of the project's idle 24 GiB machine


def _config_dir(tmp_path: Path, name: str) -> str:
    from transformers import LlamaConfig, Qwen2Config

    if name == "smollm2-135m":
        cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                          num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                          head_dim=64, tie_word_embeddings=True)  # fmt: skip
    else:
        cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                          num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                          head_dim=64, tie_word_embeddings=True)  # fmt: skip
    out = tmp_path / name
    cfg.save_pretrained(str(out))
    return str(out)


@pytest.fixture(autouse=True)
def _machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tm, "available_bytes", lambda device="cpu": MACHINE)
    monkeypatch.setattr(tm.torch.cuda, "is_available", lambda: False)


def test_defaults_fit_smollm2_beside_its_server(tmp_path: Path) -> None:
    said: list[str] = []
    cfg, plan = tm.preflight_trainer_memory(
        RunConfig(), _config_dir(tmp_path, "smollm2-135m"), said.append
    )
    t = cfg.trainer
    assert isinstance(t.update.token_budget, int) and t.update.token_budget >= 2048
    assert t.actor.gradient_checkpointing is False and t.update.logprob_chunk == 512
    # The server (2 GiB KV cache + weights + runtime) and the weight file are set aside.
    assert plan.available < MACHINE - 5e9
    assert plan.estimate.total <= 0.85 * plan.available
    assert said[0].startswith("trainer memory: token_budget=")
    assert "1 vLLM server(s) (inference.kv_cache_gb=2)" in said[0]


def test_old_defaults_are_refused_before_anything_starts(tmp_path: Path) -> None:
    """Issue #11: token_budget 8192 without checkpointing was OOM-killed at 19 GB."""
    old = RunConfig.model_validate(
        {"trainer": {"update": {"token_budget": 8192}, "actor": {"gradient_checkpointing": False}}}
    )
    with pytest.raises(ComponentError) as e:
        tm.preflight_trainer_memory(old, _config_dir(tmp_path, "smollm2-135m"), print)
    msg = str(e.value)
    assert "trainer.update.token_budget=8192" in msg
    assert "lower it or set trainer.actor.gradient_checkpointing=true" in msg


def test_half_billion_model_fits_with_checkpointing(tmp_path: Path) -> None:
    cfg, _ = tm.preflight_trainer_memory(
        RunConfig(), _config_dir(tmp_path, "qwen2.5-0.5b"), lambda s: None
    )
    assert cfg.trainer.actor.gradient_checkpointing is True
    assert cfg.trainer.update.token_budget >= 1024 and cfg.trainer.update.logprob_chunk == 128


def test_too_little_memory_names_the_settings(tmp_path: Path) -> None:
    big = RunConfig.model_validate({"inference": {"num_servers": 2, "kv_cache_gb": 6}})
    with pytest.raises(ComponentError, match=r"rollout.max_total_tokens=1024 .*kv_cache_gb"):
        tm.preflight_trainer_memory(big, _config_dir(tmp_path, "qwen2.5-0.5b"), print)


async def test_train_stops_before_any_server_starts(
    tmp_path: Path, tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`agentrl train` with the old defaults on a 135M model: a named error, no server, no OOM."""
    from agentrl.inference.fleet import Fleet
    from agentrl.orchestration.run import train

    model_dir = _config_dir(tmp_path, "smollm2-135m")  # config + tokenizer, no weights needed
    tokenizer.save_pretrained(model_dir)

    async def no_launch(*a: object, **k: object) -> None:
        raise AssertionError("a server was started before the memory check")

    monkeypatch.setattr(Fleet, "launch", no_launch)
    cfg = RunConfig.model_validate(
        {
            "model": {"path": model_dir},
            "output_dir": str(tmp_path / "runs"),
            "wandb": "disabled",
            "trainer": {
                "update": {"token_budget": 8192},
                "actor": {"gradient_checkpointing": False},
            },
        }
    )
    with pytest.raises(ComponentError, match=r"trainer.update.token_budget=8192 .*needs ~"):
        await train(cfg, say=lambda s: None)


def test_lora_plans_the_adapter_it_targets_and_a_bad_target_stops_first(tmp_path: Path) -> None:
    from agentrl.errors import TrainerSetupError

    model = _config_dir(tmp_path, "smollm2-135m")
    qv = RunConfig.model_validate(
        {"trainer": {"lora": {"rank": 8, "target_modules": ["q_proj", "v_proj"]}}}
    )
    _, plan = tm.preflight_trainer_memory(qv, model, print)
    adapter = 8 * ((576 + 576) + (576 + 192)) * 30  # r·(in + out), q and v, 30 layers
    assert plan.estimate.static == 4 * plan.shape.params + 16 * adapter  # type: ignore[union-attr]
    bad = RunConfig.model_validate({"trainer": {"lora": {"target_modules": ["qkv"]}}})
    with pytest.raises(TrainerSetupError, match=r"'qkv' is not a linear layer.*q_proj"):
        tm.preflight_trainer_memory(bad, model, print)
