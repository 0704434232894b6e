"""Chat-template doubles shared by the chat and gateway tests.

``CASES``: what each published family of tests/data/templates/ does (its doctor line
and a two-turn ``add`` episode); ``think_stripping``: a template that rewrites history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def think_stripping(tokenizer: Any) -> Any:
    """A copy of the tokenizer whose template drops <think> blocks of earlier turns (as Qwen3's)."""
    tok = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|im_end|>")
    strip = (
        "{%- set c = message.content or '' %}"
        "{%- if message.role == 'assistant' and not loop.last and '</think>' in c %}"
        "{%- set c = c.split('</think>')[-1] %}{%- endif %}"
    )
    tok.chat_template = (
        "{%- for message in messages %}" + strip + "{{- '<|im_start|>' + message.role + '\\n' + c"
        " + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    return tok


@dataclass(frozen=True)
class Case:
    """What one family does: its doctor line and its episode."""

    verdict: str
    strategy: str
    call: str  # the tool-call turn as the model samples it (end-of-turn token included)
    result: str  # the tool result as rendered after that turn, through the next generation prompt
    answer: str = "ANSWER 5"
    parser: str = "hermes"
    reasoning_parser: str | None = None
    drops_tools: bool = False
    as_sampled_holds: bool = True


_HERMES_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
_LLAMA_NEXT = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
CASES: dict[str, Case] = {
    "qwen2_5": Case(
        "consistent",
        "as_sampled",
        _HERMES_CALL,
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        "ANSWER 5<|im_end|>",
    ),
    "qwen3": Case(
        "not consistent",
        "per_turn",
        "<think>\nAdd them.\n</think>\n\n" + _HERMES_CALL,
        "<|im_start|>system\n",  # per_turn: the next sample starts with the whole prompt
        "<think>\nDone.\n</think>\n\nANSWER 5<|im_end|>",
        reasoning_parser="qwen3",
    ),
    "llama3_1_json": Case(
        "not consistent",
        "per_turn",
        '{"name": "add", "parameters": {"a": 2, "b": 3}}<|eot_id|>',
        "<|begin_of_text|><|start_header_id|>system",
        "ANSWER 5<|eot_id|>",
        parser="llama3_json",
    ),
    "llama3_2_pythonic": Case(
        "consistent",
        "as_sampled",
        "[add(a=2, b=3)]<|eot_id|>",
        "<|start_header_id|>ipython<|end_header_id|>\n\n5" + _LLAMA_NEXT,
        "ANSWER 5<|eot_id|>",
        parser="pythonic",
    ),
    "mistral_nemo": Case(
        "not consistent",
        "per_turn",
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}]</s>',
        "<s>[AVAILABLE_TOOLS]",
        "ANSWER 5</s>",
        parser="mistral",
    ),
    "deepseek_v3_1": Case(
        "not consistent",
        "per_turn",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>"
        '{"a": 2, "b": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>',
        "<｜begin▁of▁sentence｜>Use tools.",
        "ANSWER 5<｜end▁of▁sentence｜>",
        parser="deepseek_v31",
    ),
    "hermes2pro": Case(
        "not consistent",
        "per_turn",
        _HERMES_CALL,
        "<s><|im_start|>system\n",
        "ANSWER 5<|im_end|>",
    ),
    "gpt_oss": Case(
        "not consistent",
        "per_turn",
        "<|channel|>commentary to=functions.add <|constrain|>json"
        '<|message|>{"a": 2, "b": 3}<|call|>',
        "<|start|>system<|message|>",
        "<|channel|>final<|message|>ANSWER 5<|return|>",
        parser="auto",  # harmony: OpenAI's openai_harmony parser
        reasoning_parser="auto",
    ),
    "deepseek_r1_distill": Case(
        # Drops tool schemas: trained with injected Hermes tools. Only the first tool output
        # of a conversation opens <｜tool▁outputs▁begin｜>, so a delta depends on history:
        # as_sampled does not hold, per_turn does.
        "not consistent",
        "per_turn",
        'Add.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n'
        "</tool_call><｜end▁of▁sentence｜>",
        "<｜begin▁of▁sentence｜>Use tools.\n\n# Tools",
        "Done.\n</think>\n\nANSWER 5<｜end▁of▁sentence｜>",
        reasoning_parser="deepseek_r1",
        drops_tools=True,
        as_sampled_holds=False,
    ),
    "glm4_6": Case(
        # No end-of-turn token: the model stops on the next message's opener.
        "not consistent",
        "per_turn",
        "\n<think>Add them.</think>\n<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>2"
        "</arg_value>\n<arg_key>b</arg_key>\n<arg_value>3</arg_value>\n</tool_call><|observation|>",
        "[gMASK]<sop><|system|>",
        "\n<think></think>\nANSWER 5<|user|>",
        parser="glm45",
    ),
    "chatml_smollm2": Case(
        "consistent",
        "as_sampled",
        _HERMES_CALL,
        "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n",
        "ANSWER 5<|im_end|>",
        drops_tools=True,
    ),
}
