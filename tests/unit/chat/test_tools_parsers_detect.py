"""``auto`` parsers: each family's chat template (or vocabulary) picks its tool-call and
reasoning parsers; zero or several matches stop with the choices named."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from agentrl.chat.detect import detect_reasoning_parser, detect_tool_parser
from agentrl.testing.tokenizers import byte_tokenizer
from agentrl.tools import DetectedParsers, HermesToolCallParser, detect_parsers, make_tool_parser
from tests.helpers.paths import DATA

TEMPLATES = DATA / "templates"


def tokenizer(template: str | None, *specials: str) -> PreTrainedTokenizerFast:
    return byte_tokenizer(*specials, chat_template=template)


@pytest.mark.parametrize(
    ("file", "expected"),
    [
        ("qwen2_5.jinja", DetectedParsers("hermes", None)),
        ("hermes2pro.jinja", DetectedParsers("hermes", None)),
        ("qwen3.jinja", DetectedParsers("hermes", "qwen3")),
        ("llama3_1_json.jinja", DetectedParsers("llama3_json", None)),
        ("llama3_2_pythonic.jinja", DetectedParsers("pythonic", None)),
        ("mistral_nemo.jinja", DetectedParsers("mistral", None)),
        ("deepseek_v3_1.jinja", DetectedParsers("deepseek_v31", "deepseek_v3")),
        ("gpt_oss.jinja", DetectedParsers("harmony", "harmony")),
    ],
)
def test_real_family_templates(file: str, expected: DetectedParsers) -> None:
    assert detect_parsers(tokenizer((TEMPLATES / file).read_text())) == expected


# Fragments of the families' published templates: the markup that identifies each one.
R1 = (
    "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
    "'<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + "
    "tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{% set content = content.split('</think>')[-1] %}"
)
QWEN3_CODER = (
    "<|im_start|>assistant\n{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
    "{{- '<parameter=' + args_name + '>\\n' }}"
)
LLAMA4 = "<|header_start|>assistant<|header_end|>\n\n<|python_start|>[{{ call }}]<|python_end|>"
KIMI = "<|tool_calls_section_begin|><|tool_call_begin|>{{ id }}<|tool_call_argument_begin|>"
GLM45 = (
    "<|assistant|>{{- '\\n<tool_call>' + tc.name }}{% for k, v in tc.arguments.items() %}"
    "\n<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v }}</arg_value>{% endfor %}</tool_call>"
)
MAGISTRAL = "[INST]{{ m }}[/INST][THINK]{{ thinking }}[/THINK][TOOL_CALLS]{{ name }}[ARGS]"


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (R1, DetectedParsers("deepseek_v3", "deepseek_r1")),
        (QWEN3_CODER, DetectedParsers("qwen3_xml", None)),
        (LLAMA4, DetectedParsers("llama4_pythonic", None)),
        (KIMI, DetectedParsers("kimi_k2", None)),
        (MAGISTRAL, DetectedParsers("mistral", "mistral")),
        (GLM45, DetectedParsers("glm45", None)),
    ],
    ids=["deepseek-r1", "qwen3-coder", "llama4", "kimi-k2", "magistral", "glm45"],
)
def test_template_fragments(template: str, expected: DetectedParsers) -> None:
    assert detect_parsers(tokenizer(template)) == expected


def test_without_a_template_the_vocabulary_decides() -> None:
    assert detect_tool_parser(tokenizer(None, "[TOOL_CALLS]", "[ARGS]")) == "mistral"
    assert detect_tool_parser(tokenizer(None, "<tool_call>", "</tool_call>")) == "hermes"
    # DeepSeek V3 and V3.1 share their tokens; only the template tells them apart.
    with pytest.raises(
        ValueError, match=r"vocabulary .*fits several tool-call formats: deepseek_v3, deepseek_v31"
    ):
        detect_tool_parser(tokenizer(None, "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>"))


def test_no_known_markup_names_the_choices() -> None:
    with pytest.raises(ValueError) as e:
        detect_tool_parser(tokenizer((TEMPLATES / "chatml_smollm2.jinja").read_text()))
    msg = str(e.value)
    assert "no known tool-call markup in the tokenizer's chat template" in msg
    for name in ("hermes", "llama3_json", "pythonic", "mistral", "deepseek_v3", "qwen3_xml"):
        assert name in msg
    assert detect_reasoning_parser(tokenizer("<|im_start|>{{ m }}<|im_end|>")) is None


def test_several_matches_name_them() -> None:
    both = tokenizer("{{ '<tool_call>' }}{{ '[TOOL_CALLS]' }}")
    with pytest.raises(
        ValueError, match=r"several tool-call formats: mistral, hermes; set rollout\.tool_parser"
    ):
        detect_tool_parser(both)
    with pytest.raises(ValueError, match="several reasoning formats: deepseek_r1, qwen3"):
        detect_reasoning_parser(tokenizer("<s>{{ '<think>' }}</s>"))


def test_auto_builds_the_detected_parser() -> None:
    tok = tokenizer((TEMPLATES / "qwen2_5.jinja").read_text(), "<tool_call>", "</tool_call>")
    assert isinstance(make_tool_parser("auto", tok), HermesToolCallParser)
    with pytest.raises(ValueError, match="'auto' needs the model's tokenizer"):
        make_tool_parser("auto")
