"""vLLM's tool-call and reasoning parsers through agentrl's adapters, on real model-output text.

Each family's text is written here from its public format (chat templates and
model cards); the tokenizers are tiny byte-level ones carrying the family's
special tokens, which is all vLLM's parsers look up.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import textwrap

import pytest

from agentrl import Action, Env, Message, StepResult, StopReason
from agentrl.chat.vllm_parsers import VLLMToolCallParser
from agentrl.config import RunConfig
from agentrl.orchestration.startup import loop_config
from agentrl.rollout import AgentLoop, LoopConfig
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy
from agentrl.testing.tokenizers import byte_tokenizer
from agentrl.tools import (
    HermesToolCallParser,
    ParsedOutput,
    make_reasoning_parser,
    make_tool_parser,
    make_turn_parser,
    tool,
)
from agentrl.types import ToolCall

pytest.importorskip("vllm.tool_parsers")

DS = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
)
DS_SEP = "<｜tool▁sep｜>"
THINK = ("<think>", "</think>")


family_tokenizer = functools.cache(byte_tokenizer)
"""A byte-level tokenizer with the family's special tokens (one per distinct set)."""


def calls(out: ParsedOutput) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in out.tool_calls]


# --- one test per family: the text its models write -------------------------------------


def test_hermes_qwen25_two_calls_via_vllm() -> None:
    parser = make_tool_parser("vllm:hermes", family_tokenizer("<tool_call>", "</tool_call>"))
    assert isinstance(parser, VLLMToolCallParser)
    text = (
        "Let me look both up.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
        "</tool_call>\n"
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>'
    )
    out = parser.parse(text)
    assert out.content == "Let me look both up."
    assert out.tool_calls == (
        ToolCall("get_weather", {"city": "Paris", "unit": "c"}, "call_0"),
        ToolCall("get_time", {"tz": "Europe/Paris"}, "call_1"),
    )
    assert out.errors == ()


def test_plain_hermes_name_stays_agentrls_own_parser() -> None:
    tok = family_tokenizer("<tool_call>", "</tool_call>")
    assert isinstance(make_tool_parser("hermes", tok), HermesToolCallParser)
    assert isinstance(make_tool_parser("hermes"), HermesToolCallParser)  # no tokenizer needed


QWEN3_CODER = (
    "I'll compute it.\n<tool_call>\n<function=add>\n<parameter=a>\n17\n</parameter>\n"
    "<parameter=note>\nfrom the user\n</parameter>\n</function>\n</tool_call>"
)
ADD_SCHEMA = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Adds.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "note": {"type": "string"}},
        },
    },
}


def test_qwen3_xml_coder_format_typed_by_the_tool_schema() -> None:
    parser = make_tool_parser("qwen3_xml", family_tokenizer("<tool_call>", "</tool_call>"))
    untyped = parser.parse(QWEN3_CODER)
    assert untyped.content == "I'll compute it."
    assert calls(untyped) == [("add", {"a": "17", "note": "from the user"})]
    typed = make_turn_parser("qwen3_xml", None, parser.tokenizer).with_tools([ADD_SCHEMA])
    assert calls(typed.parse(QWEN3_CODER)) == [("add", {"a": 17, "note": "from the user"})]


def test_llama31_json_with_and_without_python_tag() -> None:
    parser = make_tool_parser("llama3_json", family_tokenizer("<|python_tag|>", "<|eom_id|>"))
    bare = parser.parse('{"name": "get_weather", "parameters": {"city": "Paris"}}')
    assert calls(bare) == [("get_weather", {"city": "Paris"})] and bare.content == ""
    tagged = parser.parse('<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}')
    assert calls(tagged) == [("add", {"a": 1, "b": 2})]
    assert tagged.tool_calls[0].id == "call_0"


def test_pythonic_llama32_and_llama4() -> None:
    py = make_tool_parser("pythonic", family_tokenizer())
    out = py.parse('[get_weather(city="Paris", days=3), add(a=1, b=-2.5)]')
    assert calls(out) == [
        ("get_weather", {"city": "Paris", "days": 3}),
        ("add", {"a": 1, "b": -2.5}),
    ]
    assert [c.id for c in out.tool_calls] == ["call_0", "call_1"]
    l4 = make_tool_parser("llama4_pythonic", family_tokenizer("<|python_start|>", "<|python_end|>"))
    out4 = l4.parse('<|python_start|>[search(query="vllm", top_k=5)]<|python_end|>')
    assert calls(out4) == [("search", {"query": "vllm", "top_k": 5})]


MISTRAL_TEMPLATE = textwrap.dedent("""\
    {%- for m in messages %}
    {%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]
    {%- elif m.role == 'assistant' %}{{ m.content }}[TOOL_CALLS][
    {%- for tc in m.tool_calls %}
    {%- if tc.id is not defined or tc.id|length != 9 or not tc.id.isalnum() %}
    {{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}
    {%- endif %}{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments|tojson }},
     "id": "{{ tc.id }}"}
    {%- if not loop.last %}, {% endif %}{%- endfor %}]</s>
    {%- elif m.role == 'tool' %}[TOOL_RESULTS]{"content": {{ m.content|tojson }},
     "call_id": "{{ m.tool_call_id }}"}[/TOOL_RESULTS]
    {%- endif %}{%- endfor %}""")


def test_mistral_v11_calls_get_9_char_ids_that_round_trip_through_the_template() -> None:
    tok = family_tokenizer("[TOOL_CALLS]", "[ARGS]", "[INST]", "[/INST]")
    parser = make_tool_parser("mistral", tok)
    out = parser.parse(
        'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]add[ARGS]{"a": 1}'
    )
    assert out.content == "Checking."
    assert calls(out) == [("get_weather", {"city": "Paris"}), ("add", {"a": 1})]
    ids = [c.id for c in out.tool_calls]
    assert all(len(i) == 9 and i.isalnum() for i in ids) and len(set(ids)) == 2
    convo = [
        Message.user("Weather in Paris?"),
        Action("", content=out.content, tool_calls=out.tool_calls).to_message(),
        Message.tool("18C", tool_call_id=ids[0]),
    ]
    rendered = tok.apply_chat_template(
        [m.to_dict() for m in convo], chat_template=MISTRAL_TEMPLATE, tokenize=False
    )
    assert f'"id": "{ids[0]}"' in rendered and f'"call_id": "{ids[0]}"' in rendered
    # The ids our Hermes parser gives would not render: the family needs its own.
    hermes_style = Message.assistant("", (ToolCall("add", {"a": 1}, "call_0"),))
    with pytest.raises(Exception, match="length 9"):
        tok.apply_chat_template(
            [hermes_style.to_dict()], chat_template=MISTRAL_TEMPLATE, tokenize=False
        )


def test_mistral_pre_v11_json_array() -> None:
    parser = make_tool_parser("mistral", family_tokenizer("[TOOL_CALLS]"))
    out = parser.parse(
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, '
        '{"name": "mul", "arguments": {"a": 3, "b": 4}}]'
    )
    assert calls(out) == [("add", {"a": 1, "b": 2}), ("mul", {"a": 3, "b": 4})]
    assert all(len(c.id) == 9 for c in out.tool_calls)


def test_deepseek_v3_and_v31() -> None:
    tok = family_tokenizer(*DS, DS_SEP)
    v3 = make_tool_parser("deepseek_v3", tok).parse(
        f"Adding.{DS[0]}{DS[2]}function{DS_SEP}add\n```json\n"
        f'{{"a": 1, "b": 2}}\n```{DS[3]}{DS[2]}function{DS_SEP}mul\n```json\n{{"a": 3}}\n```'
        f"{DS[3]}{DS[1]}"
    )
    assert v3.content == "Adding." and v3.errors == ()
    assert calls(v3) == [("add", {"a": 1, "b": 2}), ("mul", {"a": 3})]
    v31 = make_tool_parser("deepseek_v31", tok).parse(
        f'{DS[0]}{DS[2]}get_weather{DS_SEP}{{"city": "Paris"}}{DS[3]}{DS[1]}'
    )
    assert calls(v31) == [("get_weather", {"city": "Paris"})] and v31.content == ""


def test_kimi_k2_keeps_its_own_call_ids() -> None:
    marks = (
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    )
    parser = make_tool_parser("kimi_k2", family_tokenizer(*marks))
    out = parser.parse(
        f'Sure.{marks[0]}{marks[2]}functions.add:0{marks[3]}{{"a": 1, "b": 2}}{marks[4]}{marks[1]}'
    )
    assert calls(out) == [("add", {"a": 1, "b": 2})]
    assert out.tool_calls[0].id == "functions.add:0"


def test_glm45_arg_key_value_format() -> None:
    marks = (
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
    )
    out = make_tool_parser("glm45", family_tokenizer(*marks)).parse(
        "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
        "<arg_value>Paris</arg_value>\n</tool_call>"
    )
    assert out.content == "Let me check." and calls(out) == [("get_weather", {"city": "Paris"})]


def test_gpt_oss_stubs_are_refused_with_a_reason() -> None:
    # vLLM's harmony tool and reasoning parsers are stubs; its HarmonyParser needs
    # the o200k_harmony encoding files, which cannot be fetched here.
    tok = family_tokenizer("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|call|>")
    # Plain "openai" / "openai_gptoss" mean agentrl's harmony parser (test_tools_harmony.py).
    with pytest.raises(ValueError, match=r"'openai' tool-call parser cannot parse .*'harmony'"):
        make_tool_parser("vllm:openai", tok)
    with pytest.raises(ValueError, match=r"'openai_gptoss' reasoning parser cannot split.*harmony"):
        make_reasoning_parser("vllm:openai_gptoss", tok)


# --- reasoning ------------------------------------------------------------------------------


def test_deepseek_r1_reasoning_then_tool_calls() -> None:
    tok = family_tokenizer(*THINK, *DS, DS_SEP)
    parser = make_turn_parser("deepseek_v31", "deepseek_r1", tok)
    out = parser.parse(
        f"<think>The user wants 2+3; call add.</think>I will add.{DS[0]}{DS[2]}add{DS_SEP}"
        f'{{"a": 2, "b": 3}}{DS[3]}{DS[1]}'
    )
    assert out.reasoning == "The user wants 2+3; call add."
    assert out.content == "I will add." and calls(out) == [("add", {"a": 2, "b": 3})]
    # R1's template opens <think> in the prompt, so a turn starts inside it.
    opened = parser.parse("Only thinking here.</think>The answer is 5.")
    assert (opened.reasoning, opened.content) == ("Only thinking here.", "The answer is 5.")


def test_qwen3_reasoning_with_hermes_calls() -> None:
    tok = family_tokenizer(*THINK, "<tool_call>", "</tool_call>")
    parser = make_turn_parser("hermes", "qwen3", tok)
    out = parser.parse(
        "<think>\nNeed the weather first.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    assert out.reasoning == "Need the weather first."
    assert calls(out) == [("get_weather", {"city": "Oslo"})] and out.content == ""
    without = make_turn_parser("hermes", None, tok).parse("<think>\nx\n</think>\n\nDone.")
    assert without.reasoning == "" and "<think>" in without.content


def test_reasoning_parser_names_and_tokenizer_fit() -> None:
    assert make_reasoning_parser(None) is None and make_reasoning_parser("none") is None
    with pytest.raises(
        ValueError, match=r"unknown reasoning parser 'deepseek-r1'; nearest: deepseek_r1"
    ):
        make_reasoning_parser("deepseek-r1", family_tokenizer(*THINK))
    with pytest.raises(
        ValueError, match="'deepseek_r1' reasoning parser does not accept this tokenizer"
    ):
        make_reasoning_parser("deepseek_r1", family_tokenizer())


# --- bad input: errors the model reads, never a crash -----------------------------------------


def test_unknown_name_lists_the_nearest_and_all() -> None:
    with pytest.raises(ValueError) as e:
        make_tool_parser("lama3_json", family_tokenizer())
    msg = str(e.value)
    assert "unknown tool-call parser 'lama3_json'; nearest: llama3_json" in msg
    assert "agentrl: harmony, hermes, openai, qwen, auto" in msg
    assert "pythonic" in msg and "deepseek_v31" in msg


def test_parser_that_does_not_fit_the_tokenizer() -> None:
    with pytest.raises(
        ValueError, match="'deepseek_v3' tool-call parser does not accept this tokenizer"
    ):
        make_tool_parser("deepseek_v3", family_tokenizer("<tool_call>"))


@pytest.mark.parametrize(
    ("name", "specials", "text", "expect"),
    [
        (
            "vllm:hermes",
            ("<tool_call>", "</tool_call>"),
            'Hi <tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>',
            "'<tool_call>' appears 1x, 0 call(s) read",
        ),
        (
            "deepseek_v3",
            (*DS, DS_SEP),
            f'{DS[0]}{DS[2]}function{DS_SEP}add\n{{"a": 1}}{DS[3]}{DS[1]}',
            "could not read the tool call(s)",
        ),
        (
            "deepseek_v31",
            (*DS, DS_SEP),
            f'{DS[0]}{DS[2]}add{DS_SEP}{{"a": 1,}}{DS[3]}{DS[1]}',
            "tool call 1: arguments are not valid JSON",
        ),
        ("mistral", ("[TOOL_CALLS]", "[ARGS]"), '[TOOL_CALLS]add[ARGS]{"a": 1', "not valid JSON"),
        (
            "llama3_json",
            ("<|python_tag|>",),
            '<|python_tag|>{"name": "f", "parameters": {"x": ' + "[" * 5000 + "]" * 5000 + "}}",
            "could not read",
        ),
        (
            "llama3_json",
            ("<|python_tag|>",),
            '<|python_tag|>{"name": "f", "parameters": {"x": ' + "9" * 5000 + "}}",
            "could not read",
        ),
    ],
    ids=[
        "hermes-json",
        "deepseek_v3-no-fence",
        "deepseek_v31-json",
        "mistral-open",
        "deep",
        "digits",
    ],
)
def test_unreadable_calls_become_errors(name: str, specials: tuple, text: str, expect: str) -> None:
    out = make_tool_parser(name, family_tokenizer(*specials)).parse(text)
    assert out.tool_calls == ()
    assert len(out.errors) == 1 and expect in out.errors[0], out.errors


def test_an_exception_inside_a_vllm_parser_is_a_parse_error() -> None:
    from vllm.tool_parsers import ToolParser, ToolParserManager

    class Exploding(ToolParser):
        def extract_tool_calls(self, model_output, request):  # type: ignore[no-untyped-def]
            if model_output:
                raise RecursionError("maximum recursion depth exceeded")
            raise ValueError("empty")

    ToolParserManager.register_module("agentrl_test_exploding", module=Exploding)
    try:
        out = make_tool_parser("agentrl_test_exploding", family_tokenizer()).parse("x <call>")
    finally:
        ToolParserManager.tool_parsers.pop("agentrl_test_exploding")
    assert out.content == "x <call>" and out.tool_calls == ()
    assert out.errors == (
        "the agentrl_test_exploding tool-call parser failed on this turn (RecursionError: "
        "maximum recursion depth exceeded); write the call as the chat template shows",
    )


# --- the loop, config and import boundary -----------------------------------------------------


class AddEnv(Env):
    def reset(self, task, *, seed=None):
        self.actions: list[Action] = []
        return [Message.user("What is 2+3?")]

    @tool
    def add(self, a: int, b: int) -> int:
        """Adds.

        Args:
            a: First.
            b: Second.
        """
        return a + b

    def tools(self):
        return [self.add]

    def step(self, action: Action) -> StepResult:
        self.actions.append(action)
        return StepResult(terminated="ANSWER" in action.content)


def thinking_policy(prompt: str) -> str:
    if "<tool_response>" not in prompt:
        return (
            '<think>I should add.</think><tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}'
        )
    return "<think>Done.</think>ANSWER 5"


async def test_loop_fills_reasoning_and_reports_unreadable_calls(tokenizer) -> None:
    cfg = LoopConfig(tool_parser="vllm:hermes", reasoning_parser="deepseek_r1")
    env = AddEnv()
    traj = await AgentLoop(ScriptedLLM(TextPolicy(tokenizer, thinking_policy)), tokenizer, cfg).run(
        env, {}
    )
    assert traj.stop_reason == StopReason.DONE, traj.error
    first, last = env.actions
    assert first.reasoning == "I should add." and first.tool_calls == ()
    assert "could not read" in first.parse_errors[0]
    assert traj.metrics["tool_parse_errors"] == 1.0
    assert first.tool_results[0].content.startswith("error: the hermes tool-call parser")
    assert (last.reasoning, last.content) == ("Done.", "ANSWER 5")
    assert traj.messages[-1].reasoning == "Done."
    assert traj.messages[-1].to_dict()["reasoning_content"] == "Done."


def test_config_names_reach_the_loop_and_bad_names_stop_at_construction(tokenizer) -> None:
    cfg = RunConfig.model_validate(
        {"rollout": {"tool_parser": "auto", "reasoning_parser": "qwen3"}}
    )
    lc = loop_config(cfg)
    assert (lc.tool_parser, lc.reasoning_parser) == ("auto", "qwen3")
    loop = AgentLoop(ScriptedLLM(TextPolicy(tokenizer, str)), tokenizer, lc)
    assert isinstance(loop.parser.tools, HermesToolCallParser)  # auto → the tiny model's hermes
    assert loop.parser.reasoning is not None
    with pytest.raises(
        ValueError, match=r"unknown tool-call parser 'llama_json'; nearest: .*llama3_json"
    ):
        AgentLoop(
            ScriptedLLM(TextPolicy(tokenizer, str)), tokenizer, LoopConfig(tool_parser="llama_json")
        )


def test_the_loop_imports_and_parses_without_vllm() -> None:
    code = textwrap.dedent("""\
        import sys
        sys.modules["vllm"] = None  # as if vLLM were not installed
        import agentrl.rollout
        from agentrl.tools import make_turn_parser, make_tool_parser
        text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
        out = make_turn_parser("hermes").parse(text)
        print(out.tool_calls[0].name)
        try:
            make_tool_parser("llama3_json", object())
        except ValueError as e:
            print(e)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    name, error = run.stdout.splitlines()
    assert name == "f"
    assert re.search(r"unknown tool-call parser 'llama3_json'.*vLLM \(not installed", error)
