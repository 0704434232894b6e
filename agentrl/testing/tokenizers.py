"""A tiny tokenizer for tests and benchmarks of parsers and templates: bytes plus special tokens.

vLLM's tool-call and reasoning parsers, and agentrl's parser detection, only look up
a family's special tokens (and its chat template); a byte-level vocabulary with no
merges carrying those tokens is all they need, built in milliseconds, with no model hub.

Example:
    >>> tok = byte_tokenizer("<tool_call>", "</tool_call>")
    >>> tok.convert_tokens_to_ids("<tool_call>") >= 256
    True
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

__all__ = ["byte_tokenizer"]


def byte_tokenizer(*specials: str, chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """A fresh byte-level tokenizer (one token per byte, no merges) with ``specials`` atomic.

    Args:
        *specials: Special tokens to add (each encodes as one token).
        chat_template: The chat template to set (None for none).
    """
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"additional_special_tokens": list(specials)})
    fast.chat_template = chat_template
    return fast
