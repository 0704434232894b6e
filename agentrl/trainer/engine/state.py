"""Trainer checkpoints (save / resume) and weight export for inference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from agentrl.trainer.engine.actor import save_hf_dir
from agentrl.trainer.engine.checkpoint import (
    CheckpointError,
    atomic_checkpoint_dir,
    capture_rng_state,
    prune_checkpoints,
    restore_rng_state,
    select_checkpoint,
)
from agentrl.trainer.engine.metrics import dist_active
from agentrl.trainer.engine.parts import TrainerParts

__all__ = [
    "adapter_state_for_inference",
    "load_checkpoint",
    "read_trainer_state",
    "save_adapter",
    "save_checkpoint",
    "save_hf",
    "state_dict_for_inference",
]

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
_LOAD = StateDictOptions(full_state_dict=True)


def _full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    if dist_active():
        return cast(dict[str, torch.Tensor], get_model_state_dict(module, options=_FULL))
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def _barrier() -> None:
    if dist_active():
        dist.barrier()


def state_dict_for_inference(trainer: TrainerParts) -> dict[str, torch.Tensor]:
    """Full (unsharded) policy weights on CPU with HF parameter names, for weight sync.

    Collective under data parallelism (every worker must call); workers other than 0
    get an empty dict. A tied lm_head is omitted (loaders re-tie it). With LoRA: the merged
    weights W + s·BA under the base model's names (no ``lora_`` entries).
    """
    lora = trainer.cfg.lora
    if lora is not None and lora.per_role:
        raise ValueError(_PER_ROLE)
    sd = _full_state(trainer.policy)
    if trainer.rank != 0:
        return {}
    out = {k[len("lm.") :]: v for k, v in sd.items() if k.startswith("lm.")}
    if trainer.lora is not None:
        from agentrl.trainer.engine.lora import merged_state

        out = merged_state(trainer.policy.lm, out)
    return out


_PER_ROLE = (
    "trainer.lora.per_role trains one adapter per role, so there is no single policy: "
    "take them with adapter_states_for_inference() (save_adapter writes them all)"
)


def _need_lora(trainer: TrainerParts) -> Any:
    if trainer.lora is None:
        raise ValueError("this trainer has no adapter: set trainer.lora to train one")
    return trainer.lora


def adapter_state_for_inference(trainer: TrainerParts) -> dict[str, torch.Tensor]:
    """The LoRA adapter alone on CPU, with peft's names (what ``save_adapter`` writes).

    Raises:
        ValueError: The trainer has no adapter (``trainer.lora`` unset).
    """
    from agentrl.trainer.engine.lora import adapter_state

    if trainer.cfg.lora is not None and trainer.cfg.lora.per_role:
        raise ValueError(_PER_ROLE)
    return adapter_state(_need_lora(trainer))


def save_adapter(trainer: TrainerParts, out_dir: str | Path) -> Path:
    """Writes the adapter as peft saves it (``adapter_config.json``,
    ``adapter_model.safetensors``), loadable with ``peft.PeftModel.from_pretrained``.

    Raises:
        ValueError: The trainer has no adapter (``trainer.lora`` unset).
    """
    from agentrl.trainer.engine.lora import save_adapter as _save

    model = _need_lora(trainer)
    out = Path(out_dir)
    if trainer.rank == 0:
        _save(model, out)
    _barrier()
    return out


def _checkpoint_state(trainer: TrainerParts, name: str, module: nn.Module) -> dict[str, Any]:
    """What a checkpoint keeps of a module: all of it, or with LoRA the policy's trainable
    parameters only (the adapter, a value head; the frozen base comes from the model)."""
    sd = _full_state(module)
    if name != "policy" or trainer.lora is None:
        return sd
    keep = {n for n, p in module.named_parameters() if p.requires_grad}
    return {k: v for k, v in sd.items() if k in keep}


def save_hf(trainer: TrainerParts, out_dir: str | Path) -> Path:
    """Writes a plain HF model directory (config, safetensors, tokenizer files if known).

    With ``trainer.lora.per_role`` there is no single policy: the directory holds the base
    model, and ``adapters/<role>/`` each role's peft adapter over it.
    """
    out = Path(out_dir)
    lora = trainer.cfg.lora
    if lora is not None and lora.per_role:
        from agentrl.trainer.engine.lora import base_state

        sd = _full_state(trainer.policy)
        base = base_state({k[len("lm.") :]: v for k, v in sd.items() if k.startswith("lm.")})
        if trainer.rank == 0:
            save_hf_dir(trainer.policy.lm, base, out, trainer.source_dir)
        save_adapter(trainer, out / "adapters")
        return out
    state = trainer.state_dict_for_inference()
    if trainer.rank == 0:
        save_hf_dir(trainer.policy.lm, state, out, trainer.source_dir)
    _barrier()
    return out


def _nbytes(obj: Any) -> int:
    """Bytes of the tensors in a nested state (about what ``torch.save`` writes)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_nbytes(v) for v in obj)
    return 0


def save_checkpoint(
    trainer: TrainerParts, root: str | Path | None = None, extra: dict[str, Any] | None = None
) -> Path:
    """Saves everything needed to resume atomically under ``root/step_<global_step>``.

    Args:
        root: Checkpoint root (default ``config.checkpoint.dir``).
        extra: Caller state to keep with it (e.g. the data loader's position).
    """
    root = root or trainer.cfg.checkpoint.dir
    if root is None:
        raise ValueError("no checkpoint directory: pass root or set checkpoint.dir")
    mods: dict[str, nn.Module] = {"policy": trainer.policy}
    opts: dict[str, tuple[nn.Module, torch.optim.Optimizer]] = {
        "policy": (trainer.policy, trainer.optimizer)
    }
    if trainer.critic is not None and trainer.critic_optimizer is not None:
        mods["critic"] = trainer.critic
        opts["critic"] = (trainer.critic, trainer.critic_optimizer)
    if trainer.ref is not None and trainer.lora is None:  # LoRA: the ref is the base
        mods["ref"] = trainer.ref
    models = {k: _checkpoint_state(trainer, k, m) for k, m in mods.items()}
    optims = {
        k: get_optimizer_state_dict(m, o, options=_FULL) if dist_active() else o.state_dict()
        for k, (m, o) in opts.items()
    }
    rng = [capture_rng_state()]
    if dist_active():
        gathered: list[Any] = [None] * trainer.world
        dist.all_gather_object(gathered, rng[0])
        rng = gathered
    state = {
        "global_step": trainer.global_step,
        "optimizer_steps": trainer.optimizer_steps,
        "samples_seen": trainer.samples_seen,
        "dropped_groups_total": trainer.dropped_groups_total,
        "scheduler": trainer.scheduler.state_dict(),
        "critic_scheduler": trainer.critic_scheduler.state_dict()
        if trainer.critic_scheduler
        else None,
        "kl_ctl": trainer.kl_ctl.state_dict(),
        "rng": rng,
        "world_size": trainer.world,
        "extra": extra or {},
        "config": trainer.cfg.model_dump(mode="json"),
    }

    def save(obj: Any, path: Path) -> None:
        with open(path, "wb") as f:  # a file object: a full disk surfaces as OSError(ENOSPC)
            torch.save(obj, f)

    def write(tmp: Path) -> None:
        for k, sd in models.items():
            save(sd, tmp / f"model_{k}.pt")
        for k, osd in optims.items():
            save(osd, tmp / f"optim_{k}.pt")
        save(state, tmp / "trainer_state.pt")  # written last: marks completeness

    path = Path(root) / f"step_{trainer.global_step}"
    if trainer.rank == 0:
        need = _nbytes(models) + _nbytes(optims) + _nbytes(state)
        path = atomic_checkpoint_dir(root, trainer.global_step, write, expected_bytes=need)
        prune_checkpoints(root, trainer.cfg.checkpoint.keep_last)
    _barrier()
    return path


def _read_state(ckpt: Path) -> dict[str, Any]:
    f = ckpt / "trainer_state.pt"
    try:
        return cast(dict[str, Any], torch.load(f, map_location="cpu", weights_only=False))
    except Exception as e:
        raise CheckpointError(f"{f} cannot be read ({type(e).__name__}: {e})") from e


def read_trainer_state(ckpt: str | Path) -> dict[str, Any]:
    """A step directory's ``trainer_state.pt``: counters, the trainer's settings
    (``config``), RNG and the caller's ``extra``.

    Raises:
        CheckpointError: It cannot be read (named).
    """
    return _read_state(Path(ckpt))


def _loads(ckpt: Path) -> str | None:
    try:
        _read_state(ckpt)
    except CheckpointError as e:
        return str(e)
    return None


def _load(f: Path, *, weights_only: bool) -> Any:
    try:
        return torch.load(f, map_location="cpu", weights_only=weights_only)
    except Exception as e:
        raise CheckpointError(f"{f} cannot be read ({type(e).__name__}: {e})") from e


def _load_trainable(module: nn.Module, sd: dict[str, torch.Tensor], ckpt: Path) -> None:
    """Loads a LoRA checkpoint's trainable parameters; every one must be there."""
    want = {n for n, p in module.named_parameters() if p.requires_grad}
    lost = sorted(want - set(sd))
    extra = sorted(set(sd) - want)
    if lost or extra:
        what = f"lacks {lost[:3]}" if lost else f"has parameters this model lacks: {extra[:3]}"
        raise CheckpointError(
            f"{ckpt}: the adapter {what}; resume with the trainer.lora settings "
            "(rank, target_modules) and critic of the run that saved it"
        )
    params = dict(module.named_parameters())
    for k, v in sd.items():
        if v.shape != params[k].shape:  # another rank
            raise CheckpointError(
                f"{ckpt}: the adapter does not fit this model ({k} is {tuple(v.shape)} there, "
                f"{tuple(params[k].shape)} here); resume with the trainer.lora.rank of the "
                "run that saved it"
            )
    module.load_state_dict(sd, strict=False)


def load_checkpoint(
    trainer: TrainerParts, path: str | Path, say: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Resumes from a step directory or a root; returns ``extra``.

    Under a root, the newest checkpoint that passes verification is used; a truncated
    or corrupt newer one is passed over with a message through ``say``.

    Raises:
        NoCheckpointError: No good checkpoint there (each bad file named).
        CheckpointError: A file of the chosen checkpoint cannot be read.
    """
    ckpt = select_checkpoint(path, say, skip=_loads)
    state = _read_state(ckpt)
    saved_lora = (state.get("config") or {}).get("lora")
    if (saved_lora is None) != (trainer.lora is None):
        had = "a LoRA adapter" if saved_lora is not None else "full weights (no trainer.lora)"
        raise CheckpointError(f"{ckpt} holds {had}; set trainer.lora as the run that saved it did")
    pairs: dict[str, tuple[nn.Module, torch.optim.Optimizer | None]] = {
        "policy": (trainer.policy, trainer.optimizer)
    }
    if trainer.critic is not None:
        pairs["critic"] = (trainer.critic, trainer.critic_optimizer)
    if trainer.ref is not None and (ckpt / "model_ref.pt").is_file():
        pairs["ref"] = (trainer.ref, None)
    for k, (module, opt) in pairs.items():
        sd = _load(ckpt / f"model_{k}.pt", weights_only=True)
        if dist_active():
            set_model_state_dict(module, sd, options=_LOAD)
        elif k == "policy" and trainer.lora is not None:
            _load_trainable(module, sd, ckpt)
        else:
            module.load_state_dict(sd)
        if opt is not None:
            osd = _load(ckpt / f"optim_{k}.pt", weights_only=False)
            if dist_active():
                set_optimizer_state_dict(module, opt, osd, options=_LOAD)
            else:
                opt.load_state_dict(osd)
    trainer.scheduler.load_state_dict(state["scheduler"])
    if trainer.critic_scheduler is not None and state["critic_scheduler"] is not None:
        trainer.critic_scheduler.load_state_dict(state["critic_scheduler"])
    trainer.kl_ctl.load_state_dict(state["kl_ctl"])
    trainer.global_step = int(state["global_step"])
    trainer.optimizer_steps = int(state["optimizer_steps"])
    trainer.samples_seen = int(state["samples_seen"])
    trainer.dropped_groups_total = int(state["dropped_groups_total"])
    rng = state["rng"]
    restore_rng_state(rng[trainer.rank] if trainer.rank < len(rng) else rng[0])
    _barrier()
    return dict(state["extra"])
