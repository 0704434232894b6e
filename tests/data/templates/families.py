"""Tokenizers of published chat-template families, built locally for tests and benchmarks.

One small byte-level BPE (trained here on a little text, in well under a second) carries
every family's special tokens; each family wraps it in a ``PreTrainedTokenizerFast``
with its own bos/eos and the chat template written in ``<name>.jinja`` beside this file
(from each family's public format). No model hub is involved.

Example:
    >>> tok = family_tokenizer("qwen2_5")  # doctest: +SKIP
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Family:
    """One published template family.

    Attributes:
        template: File name of its chat template here.
        eos: Its tokenizer's eos token.
        bos: Its bos token ("" for none).
        parser: The vLLM tool-call parser name for it.
        specials: Its special tokens.
    """

    template: str
    eos: str
    bos: str
    parser: str
    specials: tuple[str, ...]


_CHATML = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
_LLAMA3 = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)
_DS = (
    "<｜begin▁of▁sentence｜> <｜end▁of▁sentence｜> <｜User｜> <｜Assistant｜> "
    "<｜tool▁calls▁begin｜> <｜tool▁calls▁end｜> <｜tool▁call▁begin｜> <｜tool▁call▁end｜> "
    "<｜tool▁sep｜> <｜tool▁output▁begin｜> <｜tool▁output▁end｜>"
)

FAMILIES: dict[str, Family] = {
    "qwen2_5": Family(
        "qwen2_5.jinja",
        "<|im_end|>",
        "",
        "hermes",
        (*_CHATML, "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
    ),
    "qwen3": Family(
        "qwen3.jinja",
        "<|im_end|>",
        "",
        "hermes",
        (
            *_CHATML,
            "<tool_call>",
            "</tool_call>",
            "<tool_response>",
            "</tool_response>",
            "<think>",
            "</think>",
        ),
    ),
    "llama3_1_json": Family(
        "llama3_1_json.jinja", "<|eot_id|>", "<|begin_of_text|>", "llama3_json", _LLAMA3
    ),
    "llama3_2_pythonic": Family(
        "llama3_2_pythonic.jinja", "<|eot_id|>", "<|begin_of_text|>", "pythonic", _LLAMA3
    ),
    "mistral_nemo": Family(
        "mistral_nemo.jinja",
        "</s>",
        "<s>",
        "mistral",
        (
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
    ),
    "deepseek_v3_1": Family(
        "deepseek_v3_1.jinja",
        "<｜end▁of▁sentence｜>",
        "<｜begin▁of▁sentence｜>",
        "deepseek_v31",
        (*_DS.split(), "<think>", "</think>"),
    ),
    "hermes2pro": Family(
        "hermes2pro.jinja",
        "<|im_end|>",
        "<s>",
        "hermes",
        ("<s>", *_CHATML, "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
    ),
    "gpt_oss": Family(
        "gpt_oss.jinja",
        "<|return|>",
        "",
        "openai",
        (
            "<|start|>",
            "<|end|>",
            "<|message|>",
            "<|channel|>",
            "<|constrain|>",
            "<|return|>",
            "<|call|>",
        ),
    ),
    "deepseek_r1_distill": Family(
        "deepseek_r1_distill.jinja",
        "<｜end▁of▁sentence｜>",
        "<｜begin▁of▁sentence｜>",
        "deepseek_v3",
        (*_DS.split(), "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<think>", "</think>"),
    ),
    "glm4_6": Family(
        "glm4_6.jinja",
        "<|endoftext|>",
        "",
        "glm45",
        (
            "[gMASK]",
            "<sop>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|observation|>",
            "<|endoftext|>",
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<arg_key>",
            "</arg_key>",
            "<arg_value>",
            "</arg_value>",
            "<tool_response>",
            "</tool_response>",
        ),
    ),
    "chatml_smollm2": Family("chatml_smollm2.jinja", "<|im_end|>", "", "hermes", _CHATML),
}


@functools.lru_cache(maxsize=1)
def _backend_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = sorted({s for f in FAMILIES.values() for s in f.specials})
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = [(HERE / f.template).read_text(encoding="utf-8") for f in FAMILIES.values()] + [
        "What is 12345 * 6789? The answer is 83810205. Let me run both. print(2 ** 10)",
        'You are a careful assistant. {"name": "python", "arguments": {"code": "print(1)"}}',
    ] * 4
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text, trainer=trainer)
    return str(tok.to_str())


def family_tokenizer(name: str) -> Any:
    """A fresh tokenizer of family ``name`` with its chat template set."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    fam = FAMILIES[name]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_backend_json()),
        eos_token=fam.eos,
        bos_token=fam.bos or None,
        additional_special_tokens=[s for s in fam.specials if s not in (fam.eos, fam.bos)],
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = (HERE / fam.template).read_text(encoding="utf-8")
    tok.name_or_path = name
    return tok
