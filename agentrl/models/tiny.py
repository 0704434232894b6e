"""The tiny default model: built here, warm-started by SFT, cached per recipe.

A Qwen2 causal LM (head_dim 64, which the vLLM CPU kernels support) with the
tokenizer of :mod:`agentrl.models.tokenizer`, random-initialised from a seed and
fine-tuned on synthetic retool demonstrations (:mod:`agentrl.models.demos`) to a
deliberately partial skill. Saved in Hugging Face format (fp32 safetensors) so
transformers and vLLM both load it, under
``$AGENTRL_CACHE_DIR`` or ``$XDG_CACHE_HOME/agentrl`` or ``~/.cache/agentrl``, in
``models/tiny-<hash of the recipe>``.

Usage:
    ``path = ensure_tiny_model()``  (or ``python -m agentrl.models.tiny``)
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "TinyRecipe",
    "build_tiny_model",
    "cache_root",
    "cached_dir",
    "ensure_tiny_model",
    "tiny_config",
    "tiny_task_kwargs",
]

_RECIPE_VERSION = 3
_MARKER = "agentrl_tiny.json"


@dataclass(frozen=True)
class TinyRecipe:
    """Everything that determines the tiny model (its hash names the cache entry).

    Attributes:
        seed: Seeds the tokenizer corpus, init, demonstrations and batch order.
        hidden_size: Model width.
        num_layers: Transformer blocks.
        num_heads: Attention heads; must be hidden_size / 64 (vLLM's Qwen2 derives
            head_dim from them, and its CPU kernels need head_dim 64).
        num_kv_heads: Key/value heads.
        intermediate_size: MLP width.
        max_position_embeddings: Context length.
        env: The env whose ``demonstrations(n, seed=...)`` warm-start the model
            (looked up in the env registry).
        num_demos: Demonstrations asked of the env.
        copy_steps: Optimizer steps on copy drills first, to grow induction heads.
        copy_batch_size: Batch size of the copy drills.
        steps: SFT optimizer steps on the demonstrations.
        batch_size: SFT batch size.
        lr: SFT peak learning rate.
        bf16: Autocast SFT matmuls to bfloat16 (weights stay fp32).
    """

    seed: int = 0
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 2
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 4096
    env: str = "retool"
    num_demos: int = 4000
    copy_steps: int = 1000
    copy_batch_size: int = 32
    steps: int = 2500
    batch_size: int = 16
    lr: float = 1e-3
    bf16: bool = False

    def key(self) -> str:
        """Short stable hash of the recipe."""
        blob = json.dumps({"v": _RECIPE_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


_TASK_KWARGS: dict[str, dict[str, Any]] = {"retool": {"level": "tiny"}}


def tiny_task_kwargs(env: str) -> dict[str, Any]:
    """Arguments of ``env``'s ``default_tasks`` for the problems the tiny model was
    warm-started on (``{}`` for an env it was not)."""
    return dict(_TASK_KWARGS.get(env, {}))


def cache_root() -> Path:
    """agentrl's cache directory (``$AGENTRL_CACHE_DIR``, else XDG, else ``~/.cache/agentrl``)."""
    if env := os.environ.get("AGENTRL_CACHE_DIR"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "agentrl"


def cached_dir(
    root: Path,
    name: str,
    marker: str,
    build: Callable[[Path], object],
    *,
    announce: Callable[[Path], None] | None = None,
) -> Path:
    """Returns ``root/name``, first building it with ``build(tmp)`` if its ``marker`` is missing.

    Safe to call from concurrent processes: one builds, the others wait on a file
    lock (``root/.name.lock``). The build goes into a temporary directory renamed into
    place when done, so a failed or killed build leaves no half-written entry.

    Args:
        root: The cache directory holding the entries (created if missing).
        name: The entry's directory name (its content key).
        marker: A file ``build`` writes last; its presence marks a complete entry.
        build: Writes the entry into the directory it is given.
        announce: Called with the entry's path just before a build starts.
    """
    final = root / name
    if (final / marker).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / marker).is_file():
            return final
        if announce is not None:
            announce(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.build-", dir=root))
        try:
            build(tmp)
            if final.exists():
                shutil.rmtree(final)
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def tiny_config(recipe: TinyRecipe, vocab_size: int, eos_id: int, pad_id: int) -> Any:
    """The ``Qwen2Config`` of the tiny model."""
    from transformers import Qwen2Config

    if recipe.num_heads * 64 != recipe.hidden_size:
        raise ValueError(
            f"tiny recipe: hidden_size {recipe.hidden_size} != 64 * num_heads {recipe.num_heads}; "
            "vLLM's Qwen2 uses head_dim = hidden_size / num_heads and its CPU kernels need 64"
        )
    kwargs: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": recipe.hidden_size,
        "intermediate_size": recipe.intermediate_size,
        "num_hidden_layers": recipe.num_layers,
        "num_attention_heads": recipe.num_heads,
        "num_key_value_heads": recipe.num_kv_heads,
        "head_dim": 64,
        "max_position_embeddings": recipe.max_position_embeddings,
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
    }
    return Qwen2Config(**kwargs)


def build_tiny_model(
    out_dir: str | Path,
    recipe: TinyRecipe | None = None,
    *,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Builds the tiny model into ``out_dir`` (created) and returns its build record.

    Args:
        out_dir: Destination directory.
        recipe: What to build (default recipe when None).
        log: Progress messages.
    """
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    from agentrl.env import provides
    from agentrl.loading.envs import resolve_env
    from agentrl.models.demos import copy_drills
    from agentrl.models.sft import encode_conversation, train_sft
    from agentrl.models.tokenizer import build_tokenizer

    recipe = recipe or TinyRecipe()
    say = log or (lambda _msg: None)
    t0 = time.monotonic()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tok = build_tokenizer(recipe.seed, model_max_length=recipe.max_position_embeddings)
    assert tok.eos_token_id is not None and tok.pad_token_id is not None
    cfg = tiny_config(recipe, len(tok), tok.eos_token_id, tok.pad_token_id)
    torch.manual_seed(recipe.seed)
    model = Qwen2ForCausalLM(cfg)
    examples = []
    if recipe.num_demos:
        env_cls = resolve_env(recipe.env)
        if not provides(env_cls, "demonstrations"):
            raise ValueError(f"tiny recipe: env {recipe.env!r} offers no demonstrations()")
        demos = env_cls.demonstrations(recipe.num_demos, seed=recipe.seed)
        examples = [encode_conversation(tok, d.messages, d.tools) for d in demos]
    say(
        f"tiny model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
        f"{len(examples)} demonstrations, {recipe.steps} SFT steps"
    )

    def on_step(step: int, loss: float) -> None:
        if step % 250 == 0:
            say(f"  step {step:4d}  loss {loss:.3f}  ({time.monotonic() - t0:.0f}s)")

    sft = functools.partial(
        train_sft,
        model,
        lr=recipe.lr,
        seed=recipe.seed,
        pad_id=tok.pad_token_id,
        log=on_step,
        bf16=recipe.bf16,
    )
    if recipe.copy_steps:
        vocab = tok.get_vocab()
        digits = [vocab[str(d)] for d in range(10)]
        sep = tok.encode(" =", add_special_tokens=False)
        drills = copy_drills(digits, sep, 20000, seed=recipe.seed, vocab=len(tok))
        say(f"copy drills: {recipe.copy_steps} steps")
        sft(drills, steps=recipe.copy_steps, batch_size=recipe.copy_batch_size)
    losses = sft(examples, steps=recipe.steps, batch_size=recipe.batch_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=[tok.eos_token_id, tok.pad_token_id], pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    record = {
        "recipe": dataclasses.asdict(recipe),
        "key": recipe.key(),
        "final_loss": sum(losses[-10:]) / max(1, min(10, len(losses))),
        "build_seconds": round(time.monotonic() - t0, 1),
    }
    (out / _MARKER).write_text(json.dumps(record, indent=2))
    return record


def ensure_tiny_model(
    recipe: TinyRecipe | None = None,
    *,
    cache_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Returns the cached tiny model's directory, building it first if needed.

    Safe to call from concurrent processes: one builds, the others wait on a file lock.

    Args:
        recipe: What to build (default recipe when None).
        cache_dir: Overrides :func:`cache_root`.
        log: Progress messages (default: to stderr).
    """
    recipe = recipe or TinyRecipe()
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    return cached_dir(
        (Path(cache_dir) if cache_dir else cache_root()) / "models",
        f"tiny-{recipe.key()}",
        _MARKER,
        lambda tmp: build_tiny_model(tmp, recipe, log=say),
        announce=lambda final: say(
            f"building the tiny default model into {final} (a few minutes, once)"
        ),
    )


if __name__ == "__main__":
    print(ensure_tiny_model())
