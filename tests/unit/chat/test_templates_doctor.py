"""`agentrl doctor tokenizer`: a verdict, a strategy and a capability line for any template,
distinct exit codes, and a template's own errors reported as findings, never a crash."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.chat.templates import EXIT_CODES, inspect_template
from agentrl.cli.app import app
from tests.data.templates.families import family_tokenizer

runner = CliRunner()


def _doctor(tok, tmp_path: Path):
    d = tmp_path / "model"
    tok.save_pretrained(str(d))
    return runner.invoke(app, ["doctor", "tokenizer", "--model", str(d)])


@pytest.mark.parametrize(
    ("family", "code", "strategy"),
    [("qwen2_5", 0, "as_sampled"), ("qwen3", 1, "per_turn"), ("llama3_1_json", 1, "per_turn")],
)
def test_exit_code_verdict_strategy_and_capability_line(family, code, strategy, tmp_path):
    res = _doctor(family_tokenizer(family), tmp_path)
    assert res.exit_code == code, res.output
    assert f"strategy: {strategy}" in res.output
    assert "capabilities: tool schemas yes, tool calls yes, tool results yes" in res.output
    assert "Traceback" not in res.output
    if family == "qwen3":
        # The diff shows where inference (earlier turns re-rendered) differs.
        assert "inference:" in res.output and "as sampled:" in res.output
        assert "agentrl doctor tokenizer" not in res.output  # no advice to run itself
    if family == "llama3_1_json":
        assert "one tool call per turn" in res.output


def test_exit_codes_are_distinct():
    assert len(set(EXIT_CODES.values())) == 3 and EXIT_CODES["consistent"] == 0
    assert 2 not in EXIT_CODES.values()  # typer's usage errors


def test_model_without_chat_template_names_the_fix(tmp_path):
    tok = family_tokenizer("qwen2_5")
    tok.chat_template = None
    res = _doctor(tok, tmp_path)
    assert res.exit_code == 3, res.output
    assert "verdict: could not check" in res.output
    assert "chat_template" in res.output and "Traceback" not in res.output


def test_a_template_that_raises_is_a_finding_with_its_own_message(tmp_path):
    tok = family_tokenizer("qwen2_5")
    tok.chat_template = "{{ raise_exception('this template wants a system message') }}"
    res = _doctor(tok, tmp_path)
    assert res.exit_code == 3, res.output
    assert "this template wants a system message" in res.output
    assert "a user message" in res.output  # which probe
    assert "Traceback" not in res.output


def test_a_template_that_raises_on_tool_calls_is_trained_with_injected_tools():
    tok = family_tokenizer("chatml_smollm2")
    tok.chat_template = (
        "{%- for m in messages %}{%- if m.tool_calls %}{{ raise_exception('no calls') }}"
        "{%- endif %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    report = inspect_template(tok)
    assert report.capabilities is not None and report.capabilities.tool_calls is False
    assert "raises on tool calls: TemplateError: no calls" in report.summary()
    assert report.inject_tools and report.verdict == "consistent"


def test_turn_not_closed_by_a_special_token_is_refused_not_truncated():
    tok = family_tokenizer("qwen2_5")
    tok.chat_template = (
        "{%- for m in messages %}{{- m.role + ': ' + m.content + '\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}"
    )
    report = inspect_template(tok)
    assert report.verdict == "could not check" and report.exit_code == 3
    assert "does not close an assistant turn with a special token" in report.error


def test_smollm2_chatml_drops_tools_and_the_fallback_injects_them():
    report = inspect_template(family_tokenizer("chatml_smollm2"))
    assert "tool schemas DROPPED, tool calls DROPPED" in report.summary()
    assert report.inject_tools and report.verdict == "consistent"
    forced = inspect_template(family_tokenizer("chatml_smollm2"), inject_tools=False)
    assert not forced.inject_tools
    assert any("inject_tools: true" in f for f in forced.fixes)


def test_the_loop_says_at_start_up_that_the_template_drops_tools(caplog):
    from agentrl.rollout import AgentLoop
    from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy

    tok = family_tokenizer("chatml_smollm2")
    with caplog.at_level("WARNING", logger="agentrl.rollout.agent_loop"):
        loop = AgentLoop(ScriptedLLM(TextPolicy(tok, lambda _: "x")), tok)
    assert loop.inject_tools
    assert [r.getMessage().count("tool schemas DROPPED") for r in caplog.records] == [1]
    assert "injecting tool schemas and calls" in caplog.text


def test_auto_parser_reads_injected_tools_with_hermes():
    from agentrl.rollout import AgentLoop, LoopConfig
    from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy

    tok = family_tokenizer("chatml_smollm2")
    cfg = LoopConfig(tool_parser="auto")
    loop = AgentLoop(ScriptedLLM(TextPolicy(tok, lambda _: "x")), tok, cfg)
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>'
    parsed = loop.parser.parse(call)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("add", {"a": 2})]


def test_the_exported_check_resolves_inject_tools_as_a_run_does():
    # Issue #43: check_chat_template said "ok" for SmolLM2's ChatML, which drops tool schemas
    # and calls, because it checked with inject_tools=False, which no run with this tokenizer
    # uses unless told to. It now checks what a run does (inject_tools unset: injected), and
    # with inject_tools=False it names the capability the run lacks instead of "ok".
    from agentrl.rollout import check_chat_template

    tok = family_tokenizer("chatml_smollm2")
    run_default = check_chat_template(tok)
    doctor = inspect_template(tok)
    assert run_default.inject_tools is doctor.inject_tools is True
    assert run_default.capabilities == doctor.capabilities
    assert run_default.ok and not run_default.lacks
    forced = check_chat_template(tok, inject_tools=False)
    assert not forced.ok and forced.tokens_ok
    assert forced.lacks == [
        "the template drops tool schemas and tool calls and inject_tools is off: the model "
        "never sees its tools; set rollout.inject_tools: true (or leave it unset)"
    ]
    assert "lacks: the template drops tool schemas and tool calls" in forced.summary()
    # A template that renders tools is checked as it is, and lacks nothing.
    qwen = check_chat_template(family_tokenizer("qwen2_5"))
    assert not qwen.inject_tools and not qwen.lacks and qwen.ok
