"""``agentrl export RUN_DIR --out DIR``: a run's checkpoint as a model other tools load.

The run's trainer is rebuilt on CPU from the checkpoint's own trainer settings and the
run's ``config.yaml`` (its ``model.path``), the checkpoint is loaded, and one of two
things is written (no server is started):

- ``--merge`` (the default): a plain Hugging Face model directory (config, safetensors,
  tokenizer files with the chat template) that transformers and vLLM load. With
  ``trainer.lora`` the weights are W + (alpha/rank)·BA; a full fine-tuning run's weights
  are the model itself.
- ``--adapter`` (``trainer.lora`` runs only): the peft adapter alone
  (``adapter_config.json`` + ``adapter_model.safetensors``, ``base_model_name_or_path``
  set to the base model's directory), which ``peft.PeftModel.from_pretrained`` loads.

Example::

    agentrl export runs/retool-lora --out exported/merged
    agentrl export runs/retool-lora --out exported/adapter --adapter --step 20
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from agentrl.errors import UserError

__all__ = ["ExportError", "export_cmd", "export_run"]


class ExportError(UserError):
    """A run, step or output directory that ``agentrl export`` cannot use (named)."""


def _checkpoint(run: Path, step: int | None, say: Any) -> Path:
    """The chosen checkpoint: step ``step``, else the newest that verifies."""
    from agentrl.trainer.engine.checkpoint import (
        PREFIX,
        CheckpointError,
        list_checkpoints,
        select_checkpoint,
        verify_checkpoint,
    )

    root = run / "checkpoints"
    have = [int(p.name[len(PREFIX) :]) for p in list_checkpoints(root)]
    if not have:
        raise ExportError(f"{run} has no checkpoint ({root} holds none): nothing to export")
    if step is not None:
        if step not in have:
            raise ExportError(
                f"--step {step}: {run} has no checkpoint of that step; it has steps "
                f"{', '.join(map(str, have))}"
            )
        path = root / f"{PREFIX}{step}"
        problem = verify_checkpoint(path)
        if problem:
            raise ExportError(f"--step {step}: checkpoint {path} is unusable: {problem}")
        return path
    try:
        return select_checkpoint(root, say)
    except CheckpointError as e:
        raise ExportError(f"{run}: {e}") from e


def _out_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; give a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(
            f"--out {out} exists and is not empty; choose another directory or pass --force "
            "(files of the same name are overwritten)"
        )


def _trainer_config(ckpt: Path) -> Any:
    """The trainer settings the checkpoint was saved with, for export: no reference model
    (a full fine-tuning run's KL copy is not exported) and no checkpoint directory."""
    from agentrl.trainer import TrainerConfig
    from agentrl.trainer.engine.checkpoint import CheckpointError
    from agentrl.trainer.engine.state import read_trainer_state

    try:
        saved = read_trainer_state(ckpt).get("config")
    except CheckpointError as e:
        raise ExportError(str(e)) from e
    if not saved:
        raise ExportError(f"{ckpt} does not record its trainer settings (saved by an old agentrl)")
    try:
        cfg = TrainerConfig.model_validate(saved)
    except ValueError as e:  # settings this agentrl no longer has
        raise ExportError(f"{ckpt}: its trainer settings do not load here: {e}") from e
    return cfg.model_copy(
        update={
            "kl": cfg.kl.model_copy(update={"coef": 0.0, "adaptive": False}),
            "checkpoint": cfg.checkpoint.model_copy(update={"dir": None}),
            "cpus": [],
        }
    )


def export_run(
    run_dir: str | Path,
    out_dir: str | Path,
    *,
    adapter: bool = False,
    step: int | None = None,
    force: bool = False,
    say: Any = print,
) -> Path:
    """Writes the merged model (or with ``adapter`` the LoRA adapter) of a run's checkpoint.

    Raises:
        ExportError: No such run, no checkpoint (of ``step``), a non-empty ``out_dir``
            without ``force``, or ``adapter`` for a run that trained every weight.
    """
    from agentrl.config import load_config
    from agentrl.orchestration.startup import resolve_model_dir
    from agentrl.trainer import Trainer

    run, out = Path(run_dir), Path(out_dir)
    if not run.is_dir():
        raise ExportError(f"{run}: no such run directory")
    if not (run / "config.yaml").is_file():
        raise ExportError(f"{run} has no config.yaml: is it a run directory (output_dir/run_name)?")
    ckpt = _checkpoint(run, step, say)
    _out_dir(out, force)
    tcfg = _trainer_config(ckpt)
    if adapter and tcfg.lora is None:
        raise ExportError(
            f"--adapter: {run} trained every weight (no trainer.lora), so there is no "
            "adapter; its checkpoint is the whole model: export it with --merge"
        )
    if not adapter and getattr(tcfg.lora, "per_role", False):
        raise ExportError(
            f"--merge: {run} trained one adapter per role (trainer.lora.per_role), so there "
            "is no single merged model; export the adapters with --adapter"
        )
    model_dir = resolve_model_dir(load_config(run / "config.yaml", []), say)
    say(f"exporting {ckpt} ({'adapter' if adapter else 'merged model'}) to {out}")
    trainer = Trainer(tcfg, model_dir, device="cpu")
    trainer.load_checkpoint(ckpt)
    if not adapter:
        return trainer.save_hf(out)
    trainer.save_adapter(out)
    conf = out / "adapter_config.json"
    meta = json.loads(conf.read_text())
    meta["base_model_name_or_path"] = str(Path(model_dir).resolve())
    conf.write_text(json.dumps(meta, indent=2, sort_keys=True))
    return out


def export_cmd(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (output_dir/run_name).")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write (new or empty).")],
    merge: Annotated[
        bool, typer.Option("--merge", help="A merged HF model directory (the default).")
    ] = False,
    adapter: Annotated[
        bool, typer.Option("--adapter", help="The peft adapter alone (trainer.lora runs).")
    ] = False,
    step: Annotated[
        int | None, typer.Option("--step", help="The checkpoint of this step (default: newest).")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Write into a non-empty --out directory.")
    ] = False,
) -> None:
    """Write a run's checkpoint as a merged HF model (--merge) or a peft adapter (--adapter)."""
    if merge and adapter:
        raise ExportError("--merge and --adapter: choose one")
    path = export_run(run_dir, out, adapter=adapter, step=step, force=force, say=typer.echo)
    typer.echo(str(path))
