"""The tiny model's tokenizer: a byte-level BPE trained here, deterministically.

Pre-tokenization follows Qwen2 (NFC, its split regex with one digit per piece,
byte-level alphabet), so every digit is its own token and any text encodes without
unknown tokens. Chat/tool markup tokens are special and atomic; ``<|im_end|>`` is
EOS and ``<|endoftext|>`` pads. The chat template is ``chat_template.jinja`` next to
this file. There is no BOS token (as in Qwen2).

Example:
    >>> tok = build_tokenizer()
    >>> [tok.decode([i]) for i in tok.encode("x=42", add_special_tokens=False)][-2:]
    ['4', '2']
"""

from __future__ import annotations

import functools
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from agentrl.models.corpus import synthetic_corpus

__all__ = [
    "CHAT_TEMPLATE_PATH",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "build_tokenizer",
    "chat_template",
    "save_tokenizer",
]

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (
    PAD_TOKEN,
    "<|im_start|>",
    EOS_TOKEN,
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
"""Special tokens, in id order (ids 0..8)."""

CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")

# Qwen2's split pattern: letters, single digits (\p{N} alone), punctuation runs, newlines, spaces.
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEFAULT_VOCAB_SIZE = 3072


def chat_template() -> str:
    """The chat template text the tokenizer carries."""
    return CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")


@functools.lru_cache(maxsize=4)
def _trained_json(seed: int, vocab_size: int) -> str:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_corpus(seed), trainer=trainer)
    return tok.to_str()


def build_tokenizer(
    seed: int = 0, *, vocab_size: int = DEFAULT_VOCAB_SIZE, model_max_length: int = 4096
) -> PreTrainedTokenizerFast:
    """Trains (or returns from an in-process cache) the tiny model's tokenizer.

    Args:
        seed: Seed of the synthetic training corpus; same seed, same tokenizer.
        vocab_size: Target vocabulary size, special tokens and byte alphabet included.
        model_max_length: Longest sequence the model is meant to take.

    Returns:
        A fresh ``PreTrainedTokenizerFast`` with EOS ``<|im_end|>``, pad
        ``<|endoftext|>`` and the agentrl chat template.
    """
    backend = Tokenizer.from_str(_trained_json(seed, vocab_size))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=list(SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:]),
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = chat_template()
    return tok


def save_tokenizer(directory: str | Path, *, seed: int = 0) -> Path:
    """Builds the tokenizer and writes it (with its chat template) to ``directory``.

    Returns:
        The directory, loadable with ``AutoTokenizer.from_pretrained``.
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    build_tokenizer(seed).save_pretrained(str(path))
    return path
