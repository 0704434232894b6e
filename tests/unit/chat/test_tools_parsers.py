"""Hermes tool-call parser: good, malformed, multiple and unclosed calls; registry; rendering."""

from __future__ import annotations

import json

import jinja2
import pytest

from agentrl.chat import parsers as parsers_mod
from agentrl.tools import HermesToolCallParser, ParsedOutput, get_parser, render_tool_call
from agentrl.types import Message, ToolCall
from tests.helpers.paths import REPO

USAGE = 'use <tool_call>{"name": ..., "arguments": {...}}</tool_call>'
P = HermesToolCallParser()


def test_text_without_calls() -> None:
    assert P.parse("  The answer is 4.\n") == ParsedOutput("The answer is 4.")


def test_one_call_after_text() -> None:
    out = P.parse(
        'I will add.\n<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    )
    assert out == ParsedOutput(
        content="I will add.",
        tool_calls=(ToolCall("add", {"a": 1, "b": 2}, "call_0"),),
    )


def test_multiple_calls_whitespace_and_string_arguments() -> None:
    text = (
        "First.\n"
        '<tool_call>\n  {"name": "a", "arguments": {}}\n</tool_call>\n'
        "Between.\n"
        '<tool_call>{"name": "b", "arguments": "{\\"x\\": [1, 2]}"}</tool_call>'
        '<tool_call>{"name": "c"}</tool_call>'
    )
    out = P.parse(text)
    assert out.content == "First.\n\nBetween."
    assert out.tool_calls == (
        ToolCall("a", {}, "call_0"),
        ToolCall("b", {"x": [1, 2]}, "call_1"),
        ToolCall("c", {}, "call_2"),
    )
    assert out.errors == ()


def test_malformed_calls_become_errors_and_good_ones_survive() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}</tool_call>'  # missing brace
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": [1]}</tool_call>'
        '<tool_call>{"name": "ok", "arguments": {"y": 2}}</tool_call>'
        '<tool_call>{"name": "c", "arguments": "{oops"}</tool_call>'
        "<tool_call>[1, 2]</tool_call>"
    )
    out = P.parse(text)
    assert out.content == ""
    assert out.tool_calls == (ToolCall("ok", {"y": 2}, "call_0"),)
    assert out.errors == (
        "tool call 1: invalid JSON (Expecting ',' delimiter at char 35): "
        '{"name": "a", "arguments": {"x": 1}; ' + USAGE,
        'tool call 2: missing "name" (a non-empty string); ' + USAGE,
        'tool call 3: "arguments" must be a JSON object, got list; ' + USAGE,
        'tool call 5: "arguments" string is not valid JSON '
        "(Expecting property name enclosed in double quotes at char 1); " + USAGE,
        "tool call 6: expected a JSON object, got list; " + USAGE,
    )


def test_unclosed_call_at_the_end() -> None:
    out = P.parse('Let me run it.\n<tool_call>{"name": "python", "arguments": {"code": "1"}}')
    assert out.content == "Let me run it."
    assert out.tool_calls == ()
    assert out.errors == (
        "tool call 1: no closing </tool_call> after "
        '<tool_call>{"name": "python", "arguments": {"code": "1"}}; ' + USAGE,
    )


def test_unclosed_call_followed_by_a_good_one() -> None:
    out = P.parse('<tool_call>{"name": "a"\n<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    assert out.tool_calls == (ToolCall("b", {}, "call_0"),)
    assert len(out.errors) == 1
    assert out.errors[0].startswith('tool call 1: no closing </tool_call> after <tool_call>{"name"')


def test_render_is_the_inverse_of_parse_and_matches_the_chat_template() -> None:
    call = ToolCall("python", {"code": 'print("héllo")\n', "n": 2}, "call_0")
    assert P.parse(render_tool_call(call)).tool_calls == (call,)

    # The chat template writes tool calls the same way (HF's tojson: json.dumps, no sorting).
    env = jinja2.Environment()
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    template_path = REPO / "agentrl/models/chat_template.jinja"
    template = env.from_string(template_path.read_text())
    msg = Message.assistant("", (call,))
    rendered = template.render(messages=[msg.to_dict()])
    assert rendered == f"<|im_start|>assistant\n{render_tool_call(call)}<|im_end|>\n"


def test_parser_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(get_parser("hermes"), HermesToolCallParser)
    assert isinstance(get_parser("qwen"), HermesToolCallParser)
    valid = "valid: harmony, hermes, openai, qwen"
    with pytest.raises(ValueError, match=f"unknown tool-call parser 'llama'; {valid}"):
        get_parser("llama")

    monkeypatch.setattr(parsers_mod, "_PARSERS", dict(parsers_mod._PARSERS))

    class Fake:
        def parse(self, text: str) -> ParsedOutput:
            return ParsedOutput(text.upper())

    parsers_mod.register_parser("fake", Fake)
    assert get_parser("fake").parse("hi") == ParsedOutput("HI")
    with pytest.raises(ValueError, match="already registered"):
        parsers_mod.register_parser("hermes", Fake)


def test_hermes_fallback_survives_deep_nesting_and_huge_integers() -> None:
    parser = P
    deep = parser.parse(
        '<tool_call>{"name": "f", "arguments": {"x": ' + "[" * 3000 + "]" * 3000 + "}}</tool_call>"
    )
    digits = parser.parse(
        '<tool_call>{"name": "f", "arguments": {"x": ' + "7" * 5000 + "}}</tool_call>"
    )
    assert deep.tool_calls == () and "RecursionError" in deep.errors[0]
    assert digits.tool_calls == () and "ValueError" in digits.errors[0]
