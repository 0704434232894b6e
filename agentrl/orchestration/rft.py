"""Rejection-sampling fine-tuning from a run directory (``agentrl sft --from RUN_DIR``).

Reads every saved episode of a run (``RUN_DIR/trajectories/step_*.parquet``), keeps
those whose reward is at least ``min_reward``, trains the run's starting model (or
``model``) on their model tokens with ``agentrl.trainer.objectives.rft.sft_step`` (loss-masked
exactly as RL trains them) and writes a plain HF model directory that
``agentrl train model.path=...`` and vLLM load.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentrl.types import Trajectory

__all__ = ["SFTError", "SFTResult", "read_run_episodes", "run_sft", "select_episodes"]


class SFTError(ValueError):
    """Rejection-sampling fine-tuning cannot start; the message says why."""


@dataclass(frozen=True)
class SFTResult:
    """What ``run_sft`` did.

    Attributes:
        output_dir: The saved HF model directory.
        episodes_total: Episodes read from the run.
        episodes_kept: Episodes at or above the threshold (with model tokens).
        steps: Optimizer steps taken.
        nll_first: Mean NLL per model token at the first step.
        nll_last: Mean NLL per model token at the last step (before its update).
    """

    output_dir: Path
    episodes_total: int
    episodes_kept: int
    steps: int
    nll_first: float
    nll_last: float


def read_run_episodes(run_dir: str | Path) -> list[Trajectory]:
    """Every episode saved in ``run_dir``, in step order.

    Raises:
        SFTError: No such directory, or no trajectory file in it.
    """
    from agentrl.reporting.run_dir import read_trajectories

    root = Path(run_dir)
    if not root.is_dir():
        raise SFTError(f"run directory {str(root)!r} does not exist")
    files = sorted((root / "trajectories").glob("step_*.parquet"))
    if not files:
        raise SFTError(
            f"no trajectories in {str(root)!r} (expected trajectories/step_*.parquet, "
            "written by agentrl train)"
        )
    out: list[Trajectory] = []
    for f in files:
        try:
            out += read_trajectories(f)
        except Exception as e:  # pyarrow raises several types for a damaged file
            raise SFTError(f"cannot read {f}: {type(e).__name__}: {e}") from e
    return out


def select_episodes(episodes: list[Trajectory], min_reward: float) -> list[Trajectory]:
    """The episodes with reward ≥ ``min_reward`` and at least one model token.

    Raises:
        SFTError: None qualifies (the message gives the best reward seen).
    """
    kept = [t for t in episodes if t.reward >= min_reward and t.num_model_tokens]
    if not kept:
        best = max((t.reward for t in episodes), default=math.nan)
        raise SFTError(
            f"no episode of {len(episodes)} has reward >= {min_reward} and a model token "
            f"(best reward: {best}); lower --min-reward"
        )
    return kept


def _run_model(root: Path, say: Callable[[str], None]) -> str:
    from agentrl.config import ConfigError, load_config
    from agentrl.orchestration.startup import resolve_model_dir

    saved = root / "config.yaml"
    if not saved.is_file():
        raise SFTError(f"{str(root)!r} has no config.yaml to find its model: give --model")
    try:
        cfg = load_config(saved, [])
    except ConfigError as e:
        raise SFTError(f"{saved}: {e}") from e
    return resolve_model_dir(cfg, say)


def run_sft(
    run_dir: str | Path,
    *,
    min_reward: float,
    output_dir: str | Path | None = None,
    model: str | None = None,
    epochs: int = 1,
    batch_size: int = 8,
    lr: float = 1e-5,
    seed: int = 0,
    say: Callable[[str], None] = print,
) -> SFTResult:
    """Fine-tunes on a run's episodes with reward ≥ ``min_reward``; saves the model.

    Args:
        run_dir: A run directory written by ``agentrl train``.
        min_reward: Keep episodes whose reward is at least this.
        output_dir: Where the model is saved (default ``RUN_DIR/sft_model``).
        model: Model directory or name to start from (default: the run's ``model.path``,
            resolved as the run resolved it).
        epochs: Passes over the kept episodes.
        batch_size: Episodes per optimizer step.
        lr: AdamW learning rate (constant).
        seed: Seeds the episode order and the trainer.

    Raises:
        SFTError: No run directory, no trajectories, no episode above the threshold,
            or no model to start from.
    """
    from agentrl.trainer import Trainer, TrainerConfig
    from agentrl.trainer.objectives.rft import sft_step

    if epochs < 1 or batch_size < 1:
        raise SFTError("epochs and batch_size must be >= 1")
    root = Path(run_dir)
    episodes = read_run_episodes(root)
    kept = select_episodes(episodes, min_reward)
    say(f"{len(kept)} of {len(episodes)} episodes have reward >= {min_reward}")
    if model:
        from agentrl.models.gguf import ModelImportError
        from agentrl.models.registry import resolve_model

        try:
            model_dir = resolve_model(model, log=say)
        except ModelImportError as e:
            raise SFTError(f"model {model!r}: {e}") from e
        if not Path(model_dir).is_dir():
            raise SFTError(f"model {model!r} is not a directory")
    else:
        model_dir = _run_model(root, say)
    out = Path(output_dir) if output_dir is not None else root / "sft_model"
    cfg = TrainerConfig.model_validate({"seed": seed, "optim": {"lr": lr}})
    trainer = Trainer(cfg, model_dir, max_seq_len=max(len(t) for t in kept))
    rng = random.Random(seed)
    nlls: list[float] = []
    for epoch in range(epochs):
        order = list(kept)
        rng.shuffle(order)
        for s in range(0, len(order), batch_size):
            m = sft_step(trainer, order[s : s + batch_size])
            nlls.append(m["sft/nll"])
            say(f"epoch {epoch + 1} step {len(nlls)}: nll {m['sft/nll']:.4f}")
    trainer.save_hf(out)
    say(f"saved {out}")
    return SFTResult(out, len(episodes), len(kept), len(nlls), nlls[0], nlls[-1])
