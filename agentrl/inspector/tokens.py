"""Token ids to text for the inspector: which tokenizer a run used, and per-token decoding.

Trajectories store token ids only. The tokenizer is looked for, in order: the one
given (``--tokenizer``), the run's ``final_model/``, the run config's
``model.path`` (a named model's cached directory), and the tiny model's (rebuilt
from ``model.tiny_seed``) when the run trained it. Without one, tokens are shown as
their ids.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tokenizers import Tokenizer

__all__ = ["TokenDecoder", "TokenizerNotFoundError", "find_decoder"]


class TokenizerNotFoundError(ValueError):
    """A tokenizer that was asked for could not be loaded (the message says why)."""


@dataclass
class TokenDecoder:
    """Decodes one token at a time (cached per id).

    Attributes:
        tokenizer: A ``tokenizers.Tokenizer``.
        source: Where it came from, for the page.
    """

    tokenizer: Tokenizer
    source: str
    _cache: dict[int, str] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def decode(self, ids: Sequence[int]) -> list[str]:
        """The text of each token alone (special tokens kept; a partial UTF-8 byte shows as �)."""
        with self._lock:
            miss = sorted({i for i in ids if i not in self._cache})
            if miss:
                texts = self.tokenizer.decode_batch([[i] for i in miss], skip_special_tokens=False)
                self._cache.update(zip(miss, texts, strict=True))
            return [self._cache[i] for i in ids]


def _from_dir(path: Path) -> Tokenizer | None:
    f = path / "tokenizer.json"
    return Tokenizer.from_file(str(f)) if f.is_file() else None


def _run_model(run_dir: Path) -> tuple[str | None, int]:
    """(config model.path, model.tiny_seed) of a run's config.yaml."""
    f = run_dir / "config.yaml"
    if not f.is_file():
        return None, 0
    try:
        cfg = yaml.safe_load(f.read_text()) or {}
    except yaml.YAMLError:
        return None, 0
    model: Any = (cfg.get("model") or {}) if isinstance(cfg, dict) else {}
    if not isinstance(model, dict):
        return None, 0
    return model.get("path"), int(model.get("tiny_seed") or 0)


def find_decoder(
    run_dir: str | Path, tokenizer: str | None = None
) -> tuple[TokenDecoder | None, str]:
    """The run's tokenizer, or None with the reason.

    Args:
        run_dir: The run directory.
        tokenizer: A model/tokenizer directory (with tokenizer.json), or "tiny" for the
            tiny model's; None looks in the run.

    Returns:
        (decoder or None, a line saying where the tokenizer came from or why there is none).

    Raises:
        TokenizerNotFoundError: ``tokenizer`` was given and could not be loaded.
    """
    run = Path(run_dir)
    if tokenizer is not None:
        if tokenizer == "tiny":
            return _tiny(0), "tiny model (seed 0)"
        tok = _from_dir(Path(tokenizer))
        if tok is None:
            raise TokenizerNotFoundError(
                f"--tokenizer {tokenizer!r}: no tokenizer.json there (give a HF model directory)"
            )
        return TokenDecoder(tok, tokenizer), f"tokenizer from {tokenizer}"
    tok = _from_dir(run / "final_model")
    if tok is not None:
        return TokenDecoder(tok, str(run / "final_model")), f"tokenizer from {run / 'final_model'}"
    model_path, seed = _run_model(run)
    from agentrl.models.registry import TINY

    if model_path == TINY:
        return _tiny(seed), f"tiny model (seed {seed})"
    if model_path is not None:
        model_path = _named_model_dir(model_path)
        tok = _from_dir(Path(model_path))
        if tok is not None:
            return TokenDecoder(tok, model_path), f"tokenizer from {model_path}"
        return None, (
            f"no tokenizer.json in the run's model.path {model_path!r}: tokens shown as ids "
            "(give --tokenizer DIR)"
        )
    if (run / "config.yaml").is_file():
        return _tiny(seed), f"tiny model (seed {seed})"
    return None, "no config.yaml or final_model/: tokens shown as ids (give --tokenizer DIR)"


def _named_model_dir(spec: str) -> str:
    """A named model's cached directory (``smollm2-135m``), converted if need be but never
    installed; any other spec, or a name that cannot be had, unchanged."""
    from agentrl.models.gguf import ModelImportError
    from agentrl.models.registry import MODELS, get_model

    if spec not in MODELS:
        return spec
    try:
        return str(get_model(spec, install=False, log=lambda _m: None))
    except ModelImportError:
        return spec


def _tiny(seed: int) -> TokenDecoder:
    from agentrl.models.tokenizer import build_tokenizer

    return TokenDecoder(build_tokenizer(seed).backend_tokenizer, f"tiny (seed {seed})")
