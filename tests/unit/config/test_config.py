"""Run config: presets, overrides, strictness with suggestions."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agentrl.config import ConfigError, RunConfig, dump_config, load_config
from tests.helpers.paths import REPO


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
    from agentrl.config import DEFAULT_LR

    assert load_config(None, []).trainer.optim.lr == DEFAULT_LR
    cfg = load_config(None, ["trainer.loss.name=pg", "trainer.optim.weight_decay=0.1"])
    assert cfg.trainer.optim.lr == DEFAULT_LR  # a partial section is merged, not replaced
    assert cfg.trainer.loss.name == "pg" and cfg.trainer.optim.weight_decay == 0.1
    assert load_config(None, ["trainer.optim.lr=1e-6"]).trainer.optim.lr == 1e-6
    built = RunConfig.model_validate({"trainer": {"loss": {"name": "pg"}}})  # not only in YAML
    assert built.trainer.optim.lr == DEFAULT_LR


def test_the_default_model_is_smollm2_and_tiny_stays_a_name():
    from agentrl.models.registry import MODELS, is_tiny, suited_task_kwargs

    cfg = load_config(None, [])
    assert cfg.model.path == "smollm2-135m" and cfg.model.path in MODELS
    assert is_tiny("tiny") and is_tiny(None) and not is_tiny(cfg.model.path)
    # A run that sets no task_kwargs gets the problems its model can learn from.
    assert suited_task_kwargs("smollm2-135m", "retool") == {"level": "tiny"}
    assert suited_task_kwargs("tiny", "retool") == {"level": "tiny"}
    assert suited_task_kwargs("/my/model", "retool") == {}
    assert suited_task_kwargs("smollm2-135m", "swe") == {}


def test_retool_preset_is_what_train_runs_without_a_config():
    """`agentrl train --env retool` (no config) starts from configs/retool.yaml, which is
    the env's declared preset; --config, an agent of one's own and a preset-less env do not."""
    from agentrl.cli.app import _preset
    from agentrl.loading.envs import env_preset

    shipped = REPO / "configs" / "retool.yaml"
    for items in ([], ["env=retool"], ["env='retool'", "steps=2"]):
        path = _preset(None, items)
        assert path is not None and Path(path).samefile(shipped)
    assert env_preset("retool").samefile(shipped)  # type: ignore[union-attr]
    assert _preset("mine.yaml", ["env=retool"]) == "mine.yaml"
    assert _preset(None, ["agent.solve=a.py:solve"]) is None
    assert _preset(None, ["env=examples/custom_env/guess.py:GuessNumber"]) is None
    cfg = load_config(shipped, [])
    assert cfg.model.path == "smollm2-135m" and cfg.env_kwargs == {"worked_examples": 3}


def test_a_missing_env_preset_is_one_clear_error(tmp_path: Path):
    from agentrl.loading.envs import InvalidEnvError, env_preset

    (tmp_path / "lost.py").write_text(
        "from agentrl import Env\n\nclass Lost(Env):\n    preset = 'nowhere.yaml'\n"
    )
    with pytest.raises(InvalidEnvError, match=r"declares preset 'nowhere\.yaml'.*missing"):
        env_preset(f"{tmp_path / 'lost.py'}:Lost")


def test_doctor_config_takes_an_env_and_prints_its_preset():
    from typer.testing import CliRunner

    from agentrl.cli.app import app

    res = CliRunner().invoke(app, ["doctor", "config", "--env", "retool", "steps=2"])
    assert res.exit_code == 0, res.output
    printed = yaml.safe_load(res.output)
    assert printed["model"]["path"] == "smollm2-135m" and printed["steps"] == 2
    assert printed["env_kwargs"] == {"worked_examples": 3}


def test_the_trainer_scores_at_the_rollout_temperature_unless_told_otherwise() -> None:
    from agentrl.config.run import RunConfig

    follows = RunConfig.model_validate({"rollout": {"temperature": 0.7}})
    assert follows.trainer.actor.temperature == 0.7
    told = {"rollout": {"temperature": 0.7}, "trainer": {"actor": {"temperature": 1.3}}}
    assert RunConfig.model_validate(told).trainer.actor.temperature == 1.3
    greedy = RunConfig.model_validate({"rollout": {"temperature": 0.0}})
    assert greedy.trainer.actor.temperature == 1.0  # 0 cannot divide logits
