"""The run configuration: typed, documented, strict — the single source of truth.

YAML files in ``configs/`` are presets of this schema; command-line overrides
(``trainer.optim.lr=1e-6 rollout.group_size=16``) are applied on top. Unknown
keys are errors that name the key and suggest the nearest valid one.

Example:
    >>> cfg = load_config(None, ["rollout.group_size=4"])
    >>> cfg.rollout.group_size
    4
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from agentrl.config.ray import RayConfig
from agentrl.config.sections import (
    DEFAULT_LR,
    DEFAULT_MODEL,
    AgentConfig,
    EvalConfig,
    InferenceConfig,
    ModelConfig,
    OrchestrationConfig,
    RewardConfig,
    RolloutConfig,
    Strict,
)
from agentrl.reporting.early_stop import parse_rule
from agentrl.trainer.config import TrainerConfig

__all__ = [
    "DEFAULT_LR",
    "DEFAULT_MODEL",
    "AgentConfig",
    "ConfigError",
    "EvalConfig",
    "InferenceConfig",
    "ModelConfig",
    "OrchestrationConfig",
    "RolloutConfig",
    "RunConfig",
    "load_config",
]


_TRAINER_DEFAULTS: dict[str, Any] = {"optim": {"lr": DEFAULT_LR}}


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class RunConfig(Strict):
    """One training run."""

    env: str = Field("retool", description="Env name, pkg.module:Class or file.py:Class.")
    env_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the env's constructor."
    )
    tasks: str | None = Field(
        None,
        description="Training tasks (docs/envs.md#task-sources): a task file (.parquet, "
        ".jsonl, .json), a Hugging Face datasets save_to_disk directory (a DatasetDict "
        "gives its 'train' split), an .arrow file, or hf:PATH[:SPLIT] (PATH a save_to_disk "
        "directory, a data file or a folder of them, read with the datasets package: pip "
        "install 'agentrl[hf]'). None uses the env's built-in generator.",
    )
    task_columns: dict[str, str] = Field(
        default_factory=dict,
        description="Column mapping {task_field: dataset_column} applied to every row of "
        "tasks and eval.tasks before the env sees it: each row becomes exactly these fields "
        "(map a column to itself to keep it), e.g. {prompt: question, answer: answer}. "
        "Empty: rows as they are.",
    )
    task_kwargs: dict[str, Any] | None = Field(
        None,
        description="Keyword arguments for the env's built-in generator (its default_tasks), "
        "e.g. {level: standard} for retool. None: the tasks that suit the model, when agentrl "
        "knows them (retool with the tiny model or smollm2-135m: level tiny); else none.",
    )
    steps: int = Field(30, ge=0, description="Training steps.")
    seed: int = Field(0, description="Seed of the run (tasks, sampling, trainer).")
    output_dir: str = Field("runs", description="Parent directory of run directories.")
    run_name: str | None = Field(None, description="Run directory name (default: timestamp).")
    save_every: int = Field(10, ge=1, description="Checkpoint every N steps.")
    wandb: Literal["offline", "online", "disabled"] = Field(
        "offline", description="Weights & Biases mode."
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    inference: InferenceConfig = Field(default_factory=InferenceConfig, description="Servers.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Sampling.")
    orchestration: OrchestrationConfig = Field(
        default_factory=OrchestrationConfig, description="Generation/training interleaving."
    )
    trainer: TrainerConfig = Field(
        default_factory=lambda: TrainerConfig.model_validate(_TRAINER_DEFAULTS),
        description=f"The trainer (optim.lr defaults to {DEFAULT_LR:g}, tuned for the default "
        "model; set it for another, as configs/retool-gpu.yaml does).",
    )

    eval: EvalConfig = Field(default_factory=EvalConfig, description="Evaluation.")
    reward: RewardConfig = Field(
        default_factory=RewardConfig,
        description="A reward model as the episodes' reward source (reward.model=PATH); "
        "evaluation still uses the env's reward.",
    )
    agent: AgentConfig = Field(
        default_factory=AgentConfig,
        description="Bring-your-own agent (agent.solve set): episodes run the agent against "
        "the gateway instead of the env's AgentLoop; tasks still come from `tasks` or the env.",
    )
    ray: RayConfig = Field(
        default_factory=RayConfig,
        description="Ray cluster placement of servers, rollout workers and trainer workers "
        "(address None: no Ray, one process).",
    )
    early_stop: list[str] = Field(
        default_factory=list,
        description="Rules that stop the run (checkpoint, final eval, reason in summary.json), "
        "'METRIC OP VALUE [for N steps]', e.g. 'kl > 2 for 20 steps', 'entropy < 0.05 for 10 "
        "steps'; METRIC a metrics.jsonl key or kl, entropy, reward, grad_norm, truncated, "
        "length, zero_std, value_loss, is_ratio.",
    )

    @field_validator("task_columns")
    @classmethod
    def _task_columns_named(cls, value: dict[str, str]) -> dict[str, str]:
        for field, column in value.items():
            if not field.strip() or not column.strip():
                raise ValueError(
                    f"a field and the column it comes from must both be named (got "
                    f"{field!r}: {column!r})"
                )
        return value

    @field_validator("early_stop")
    @classmethod
    def _early_stop_rules_parse(cls, value: list[str]) -> list[str]:
        for rule in value:
            parse_rule(rule)  # a bad rule is a config error before anything starts
        return value

    @model_validator(mode="after")
    def _trainer_scores_at_the_sampling_temperature(self) -> Self:
        """``trainer.actor.temperature`` left unset follows ``rollout.temperature`` (> 0):
        the trainer's logprobs must be those of the distribution vLLM sampled from."""
        actor = self.trainer.actor
        if "temperature" not in actor.model_fields_set and self.rollout.temperature > 0:
            actor.temperature = self.rollout.temperature
        return self

    @field_validator("trainer", mode="before")
    @classmethod
    def _trainer_keeps_run_defaults(cls, value: Any) -> Any:
        """A partial trainer section is merged onto the run's trainer defaults."""
        return _merged(_TRAINER_DEFAULTS, value) if isinstance(value, dict) else value


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key."""


def _paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        out.append(path)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _paths(ann, path + ".")
    return out


def _suggest(key: str) -> str:
    paths = _paths(RunConfig)
    leaf = key.rsplit(".", 1)[-1]
    root = key.split(".", 1)[0]
    # A valid key with the same name in another section beats a near spelling.
    same_leaf = [p for p in paths if p.rsplit(".", 1)[-1] == leaf]
    same_leaf.sort(key=lambda p: p.split(".", 1)[0] != root)
    close = same_leaf[:3] or difflib.get_close_matches(key, paths, n=1, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"


def _explain(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"unknown key '{key}'{_suggest(key)}")
        else:
            lines.append(f"'{key}': {e['msg']} (got {e.get('input')!r})")
    return "invalid config: " + "; ".join(lines)


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"cannot set '{dotted}': '{p}' is not a section")
        node = nxt
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Reads a YAML preset (optional), applies ``key.sub=value`` overrides, validates.

    Raises:
        ConfigError: An unknown key (with the nearest valid one), a bad value, or a
            malformed override; raised before anything starts.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        loaded = yaml.safe_load(p.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping at the top")
        tree = loaded
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        _set(tree, key.strip(), yaml.safe_load(raw) if raw else "")
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_explain(e)) from None


def dump_config(cfg: RunConfig, path: str | Path) -> None:
    """Writes the resolved config as YAML (every field, defaults included)."""
    Path(path).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
