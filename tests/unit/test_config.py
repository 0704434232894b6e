"""Run config: presets, overrides, strictness with suggestions."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agentrl.config import ConfigError, RunConfig, dump_config, load_config


def test_overrides_are_typed_and_applied_over_the_preset(tmp_path: Path):
    preset = tmp_path / "p.yaml"
    preset.write_text("rollout:\n  group_size: 4\ntrainer:\n  optim:\n    lr: 0.001\n")
    cfg = load_config(preset, ["trainer.optim.lr=1e-6", "orchestration.mode=fully_async"])
    assert cfg.rollout.group_size == 4
    assert cfg.trainer.optim.lr == 1e-6
    assert cfg.orchestration.mode == "fully_async"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "rollout.group_sise=4",
            "unknown key 'rollout.group_sise'; did you mean 'rollout.group_size'",
        ),
        ("trainer.lr=1e-6", "did you mean 'trainer.critic.lr' or 'trainer.optim.lr'"),
        ("rollout.group_size=abc", "'rollout.group_size': Input should be a valid integer"),
        ("orchestration.mode=fast", "'orchestration.mode'"),
        ("no_equals_sign", "must look like key.sub=value"),
    ],
)
def test_bad_keys_and_values_name_the_key(override: str, message: str):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)


def test_unknown_key_in_a_preset_file(tmp_path: Path):
    preset = tmp_path / "p.yaml"
    preset.write_text("rollout:\n  temprature: 0.5\n")
    with pytest.raises(ConfigError, match=r"did you mean 'rollout\.temperature'"):
        load_config(preset)


def test_missing_preset_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("nope.yaml")


def test_every_field_is_documented():
    def walk(model: type, prefix: str = "") -> list[str]:
        missing = []
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(prefix + name)
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                missing += walk(ann, f"{prefix}{name}.")
        return missing

    assert walk(RunConfig) == []


def test_resolved_config_round_trips(tmp_path: Path):
    cfg = load_config(None, ["rollout.group_size=3", "steps=7"])
    dump_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["steps"] == 7


@pytest.mark.parametrize("preset", sorted(Path("configs").glob("*.yaml")))
def test_shipped_presets_validate(preset: Path):
    load_config(preset)


def test_trainer_overrides_keep_the_embedded_learning_rate():
    from agentrl.config import TINY_MODEL_LR

    assert load_config(None, []).trainer.optim.lr == TINY_MODEL_LR
    cfg = load_config(None, ["trainer.loss.name=pg", "trainer.optim.weight_decay=0.1"])
    assert cfg.trainer.optim.lr == TINY_MODEL_LR  # a partial section is merged, not replaced
    assert cfg.trainer.loss.name == "pg" and cfg.trainer.optim.weight_decay == 0.1
    assert load_config(None, ["trainer.optim.lr=1e-6"]).trainer.optim.lr == 1e-6
    built = RunConfig.model_validate({"trainer": {"loss": {"name": "pg"}}})  # not only in YAML
    assert built.trainer.optim.lr == TINY_MODEL_LR


def test_retool_preset_is_the_embedded_default():
    """`agentrl train --env retool` (no config) and `--config configs/retool.yaml` agree."""
    preset = load_config(Path(__file__).parents[2] / "configs" / "retool.yaml", [])
    assert preset.model_dump() == load_config(None, []).model_dump()
