"""Import a GGUF checkpoint as a plain Hugging Face model directory, cached by content.

transformers (with the ``gguf`` package) dequantizes a GGUF file into a torch
model, but ``save_pretrained`` refuses a GGUF-loaded model; copying its state
dict into a fresh model of the same config and saving that gives an ordinary HF
directory (fp32 safetensors, tokenizer, chat template, generation config) that
the trainer and vLLM both load like any other.

The tokenizer's eos is set to the chat template's end-of-turn token (for ChatML,
``<|im_end|>``), because the AgentLoop ends an assistant turn on eos; the
generation config's ``eos_token_id`` matches it.

The directory is ``<cache>/models/<name>-<hash>``, the hash over the file's bytes
and this converter's version, so the same file is converted once.

Usage:
    ``path = import_gguf("model.gguf")``  (or ``agentrl model import-gguf FILE``)
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.models.tiny import cache_root, cached_dir

__all__ = [
    "MARKER",
    "ModelImportError",
    "convert_gguf",
    "end_of_turn_token",
    "file_digest",
    "gguf_architecture",
    "import_gguf",
    "supported_architectures",
]

_CONVERTER_VERSION = 2
MARKER = "agentrl_import.json"
"""Written last into a converted directory: its presence means the directory is complete."""


class ModelImportError(ValueError):
    """A model cannot be imported; the message names the cause."""


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def supported_architectures() -> list[str]:
    """GGUF ``general.architecture`` values transformers can dequantize."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(GGUF_SUPPORTED_ARCHITECTURES)


def gguf_architecture(path: str | Path) -> str:
    """The ``general.architecture`` of a GGUF file (reads metadata only).

    Raises:
        ModelImportError: No such file, or not a GGUF file.
    """
    p = Path(path)
    if not p.is_file():
        raise ModelImportError(f"GGUF file {str(p)!r} does not exist")
    try:
        from gguf import GGUFReader
    except ImportError as e:
        raise ModelImportError(
            "reading GGUF files needs the `gguf` package: pip install 'agentrl[models]'"
        ) from e
    try:
        reader = GGUFReader(str(p))
        field = reader.fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except KeyError:
        raise ModelImportError(f"{str(p)!r} has no general.architecture field") from None
    except (ValueError, OSError) as e:
        raise ModelImportError(f"{str(p)!r} is not a readable GGUF file: {e}") from e


def end_of_turn_token(tokenizer: Any) -> str | None:
    """The special token the chat template writes right after an assistant message.

    Renders a user and an assistant message and returns the longest special
    token that starts the text following the assistant's content (ChatML:
    ``<|im_end|>``), or None when no special token follows it.
    """
    marker = "Zq7xK"
    text = str(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": marker}],
            tokenize=False,
        )
    )
    after = text[text.rfind(marker) + len(marker) :]
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = {t.content for t in added.values() if getattr(t, "special", False)}
    special |= set(getattr(tokenizer, "all_special_tokens", []) or [])
    hits = [s for s in special if s and after.startswith(s)]
    return max(hits, key=len) if hits else None


def _say(log: Callable[[str], None] | None) -> Callable[[str], None]:
    return log or (lambda msg: print(msg, file=sys.stderr, flush=True))


def convert_gguf(
    gguf_file: str | Path, out_dir: str | Path, *, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Dequantizes ``gguf_file`` into a plain HF directory ``out_dir``; returns its record.

    Raises:
        ModelImportError: Not a GGUF file, an architecture transformers cannot
            dequantize, or a tokenizer without a chat template / end-of-turn token.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    say = _say(log)
    src = Path(gguf_file)
    arch = gguf_architecture(src)
    if arch not in supported_architectures():
        raise ModelImportError(
            f"{src.name}: GGUF architecture {arch!r} cannot be dequantized by transformers "
            f"(it supports: {', '.join(supported_architectures())})"
        )
    t0 = time.monotonic()
    say(f"dequantizing {src.name} ({arch}, {src.stat().st_size / 2**20:.0f} MiB)")
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    if not getattr(tok, "chat_template", None):
        raise ModelImportError(
            f"{src.name} carries no chat template (tokenizer.chat_template); agentrl renders "
            "conversations with it"
        )
    eot = end_of_turn_token(tok)
    if eot is None:
        raise ModelImportError(
            f"{src.name}: the chat template writes no special token after an assistant "
            "message, so the end of a model turn cannot be told"
        )
    tok.eos_token = eot
    if tok.pad_token is None:
        tok.pad_token = eot
    loaded = AutoModelForCausalLM.from_pretrained(
        str(src.parent), gguf_file=src.name, dtype=torch.float32
    )
    config = loaded.config
    for attr in ("quantization_config", "_name_or_path"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.eos_token_id = tok.eos_token_id
    config.pad_token_id = tok.pad_token_id
    # save_pretrained refuses a GGUF-loaded model: copy its weights into a fresh one.
    model = type(loaded)(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k or not config.tie_word_embeddings]:
        raise ModelImportError(
            f"{src.name}: weights do not fit {type(model).__name__} "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    model.tie_weights()
    del loaded
    if getattr(config, "max_position_embeddings", None):
        tok.model_max_length = int(config.max_position_embeddings)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    n_params = sum(p.numel() for p in model.parameters())
    record: dict[str, Any] = {
        "source": src.name,
        "sha256": file_digest(src),
        "architecture": arch,
        "model_type": config.model_type,
        "parameters": n_params,
        "eos_token": eot,
        "converter_version": _CONVERTER_VERSION,
        "seconds": round(time.monotonic() - t0, 1),
    }
    (out / MARKER).write_text(json.dumps(record, indent=2))
    say(f"converted {src.name}: {n_params / 1e6:.0f}M parameters, eos {eot}")
    return record


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "model"


def import_gguf(
    gguf_file: str | Path,
    *,
    name: str | None = None,
    cache_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Returns the cached HF directory of ``gguf_file``, converting it first if needed.

    Safe to call from concurrent processes: one converts, the others wait on a file lock.

    Args:
        gguf_file: The GGUF file.
        name: Prefix of the cache entry (default: the file's stem).
        cache_dir: Overrides :func:`agentrl.models.tiny.cache_root`.
        log: Progress messages (default: to stderr).

    Raises:
        ModelImportError: See :func:`convert_gguf`.
    """
    src = Path(gguf_file).expanduser()
    gguf_architecture(src)  # a missing or non-GGUF file fails before hashing
    key = hashlib.sha256(f"{file_digest(src)}:{_CONVERTER_VERSION}".encode()).hexdigest()[:12]
    built: list[Path] = []

    def build(tmp: Path) -> None:
        built.append(tmp)
        convert_gguf(src, tmp, log=log)

    out = cached_dir(
        (Path(cache_dir) if cache_dir else cache_root()) / "models",
        f"{_slug(name or src.stem)}-{key}",
        MARKER,
        build,
    )
    if built:  # converted now (not found in the cache): say where it went
        _say(log)(f"saved {out}")
    return out
