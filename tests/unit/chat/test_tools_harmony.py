"""gpt-oss (harmony) turns read by agentrl's harmony parser (OpenAI's openai_harmony inside).

Turns are written as the AgentLoop passes them: decoded with special tokens, after
the generation prompt's ``<|start|>assistant``, end-of-turn token cut or kept.
"""

from __future__ import annotations

import pytest

from agentrl.chat.detect import DetectedParsers, detect_parsers
from agentrl.chat.harmony import HarmonyParser
from agentrl.chat.reasoning import make_reasoning_parser
from agentrl.tools import make_tool_parser, make_turn_parser

ANALYSIS = "<|channel|>analysis<|message|>Add 2 and 3 with the tool.<|end|>"
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json"
    '<|message|>{"a": 2, "b": 3}'
)
MUL = (  # the recipient may also stand before the channel
    '<|start|>assistant to=functions.mul<|channel|>commentary <|constrain|>json<|message|>{"x": 4}'
)
FINAL = "<|channel|>final<|message|>The sum is 5."


@pytest.fixture(scope="module")
def parser() -> HarmonyParser:
    return HarmonyParser()


@pytest.mark.parametrize("end", ["", "<|call|>"])
def test_one_call_after_analysis(parser: HarmonyParser, end: str) -> None:
    out = parser.parse(ANALYSIS + CALL + end)
    assert [(c.name, c.arguments, c.id) for c in out.tool_calls] == [
        ("add", {"a": 2, "b": 3}, "call_0")
    ]
    assert (out.content, out.reasoning, out.errors) == ("", "Add 2 and 3 with the tool.", ())


def test_two_calls_one_per_message_with_recipient_in_either_header_place(
    parser: HarmonyParser,
) -> None:
    out = parser.parse(ANALYSIS + CALL + "<|call|>" + MUL + "<|call|>")
    assert [(c.name, c.arguments, c.id) for c in out.tool_calls] == [
        ("add", {"a": 2, "b": 3}, "call_0"),
        ("mul", {"x": 4}, "call_1"),
    ]


@pytest.mark.parametrize("end", ["", "<|return|>", "<|end|>"])
@pytest.mark.parametrize("start", ["", "<|start|>assistant"])
def test_final_answer_without_a_call(parser: HarmonyParser, start: str, end: str) -> None:
    out = parser.parse(start + ANALYSIS + "<|start|>assistant" + FINAL + end)
    assert (out.content, out.tool_calls, out.errors) == ("The sum is 5.", (), ())
    assert out.reasoning == "Add 2 and 3 with the tool."


def test_malformed_arguments_are_errors_the_model_reads(parser: HarmonyParser) -> None:
    bad = CALL.replace('{"a": 2, "b": 3}', '{"a": 2,')
    out = parser.parse(bad + "<|call|>" + MUL + "<|call|>")
    assert [(c.name, c.id) for c in out.tool_calls] == [("mul", "call_0")]
    assert len(out.errors) == 1
    assert "tool call 1 (to=functions.add): invalid JSON arguments" in out.errors[0]
    assert "to=functions.NAME" in out.errors[0]  # says how to write one
    listed = parser.parse(CALL.replace('{"a": 2, "b": 3}', "[1, 2]"))
    assert "must be a JSON object, got list" in listed.errors[0]
    builtin = parser.parse("<|channel|>commentary to=browser.search<|message|>{}<|call|>")
    assert builtin.tool_calls == () and "not a function" in builtin.errors[0]


@pytest.mark.parametrize(
    "text",
    ["garbage <|message|> x", "<|channel|>", "<|end|><|call|>", "<|start|>", "{}<|return|>"],
)
def test_garbage_is_an_error_not_a_crash(parser: HarmonyParser, text: str) -> None:
    out = parser.parse(text)
    assert out.tool_calls == () and len(out.errors) == 1
    assert "could not read the turn as harmony" in out.errors[0]
    assert parser.split(text) == ("", text)


def test_plain_text_is_content(parser: HarmonyParser) -> None:
    assert parser.parse(" just text ").content == "just text"
    assert parser.parse("").errors == ()


def test_reasoning_split_leaves_the_calls_for_the_tool_parser(parser: HarmonyParser) -> None:
    thought, rest = parser.split(ANALYSIS + CALL + "<|call|>")
    assert thought == "Add 2 and 3 with the tool."
    assert "analysis" not in rest and "to=functions.add" in rest
    assert parser.split(FINAL) == ("", FINAL)


@pytest.mark.parametrize("tool_name", ["harmony", "openai"])
@pytest.mark.parametrize("reasoning_name", ["harmony", "openai_gptoss", None])
def test_registered_names_build_a_turn_parser(tool_name: str, reasoning_name: str | None) -> None:
    # No tokenizer needed: harmony brings its own encoding. vLLM's "openai" and
    # "openai_gptoss" are stubs for finished turns, so those names mean ours.
    assert isinstance(make_tool_parser(tool_name), HarmonyParser)
    out = make_turn_parser(tool_name, reasoning_name).parse(ANALYSIS + CALL + "<|call|>")
    assert [c.name for c in out.tool_calls] == ["add"]
    assert out.reasoning == "Add 2 and 3 with the tool."
    if reasoning_name:
        assert isinstance(make_reasoning_parser(reasoning_name), HarmonyParser)


def test_auto_on_the_gpt_oss_template_picks_harmony() -> None:
    from tests.data.templates.families import family_tokenizer

    tok = family_tokenizer("gpt_oss")
    assert detect_parsers(tok) == DetectedParsers("harmony", "harmony")
    turn = make_turn_parser("auto", "auto", tok)
    out = turn.parse(ANALYSIS + CALL)
    assert isinstance(turn.tools, HarmonyParser) and [c.name for c in out.tool_calls] == ["add"]


def test_without_openai_harmony_the_error_names_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from agentrl.chat import harmony

    monkeypatch.setitem(sys.modules, "openai_harmony", None)  # import fails
    harmony._encoding.cache_clear()
    try:
        with pytest.raises(ValueError, match="harmony parser needs the openai_harmony package"):
            make_tool_parser("harmony")
    finally:
        harmony._encoding.cache_clear()


def test_the_rollout_loop_imports_without_openai_harmony() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['openai_harmony'] = None\n"
        "import agentrl.rollout, agentrl.tools\n"
        "assert agentrl.tools.make_tool_parser('hermes') is not None"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
