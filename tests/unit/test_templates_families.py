"""Published chat-template families, end to end: doctor verdict and strategy, a two-turn
tool episode through the AgentLoop with the family's own tool-call text, the parsed
call, the tool result rendered in the family's format, and the exact token sequence.

Templates are written from each family's public format (tests/data/templates/);
the tokenizer is a small BPE trained here with each family's special tokens.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrl import Env, Message, StepResult, StopReason
from agentrl.rollout import AgentLoop, ChatTokenizer, LoopConfig, TemplateError
from agentrl.rollout.templates import inspect_template
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy, fake_logprob
from agentrl.types import ToolCall

sys.path.insert(0, str(Path(__file__).parents[1] / "data" / "templates"))
from families import family_tokenizer

from tests.unit.loop_fixtures import AddEnv


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


@pytest.fixture(scope="module", params=sorted(CASES))
def family(request):
    return request.param, family_tokenizer(request.param), CASES[request.param]


def test_doctor_gives_verdict_strategy_and_capabilities(family):
    _, tok, case = family
    report = inspect_template(tok, tools=[AddEnv().add.schema()])
    assert (report.verdict, report.strategy) == (case.verdict, case.strategy), report.summary()
    assert report.capabilities is not None
    assert report.capabilities.drops_tools is case.drops_tools
    assert report.inject_tools is case.drops_tools
    assert report.exit_code == (0 if case.verdict == "consistent" else 1)
    text = report.summary()
    assert f"verdict: {case.verdict}" in text and f"strategy: {case.strategy}" in text
    assert "capabilities: " in text


def _policy(tok, case: Case):
    replies = iter([case.call, case.answer])
    # The reply carries its own end-of-turn token; TextPolicy adds eos after it, which the
    # server never reaches (it stops at the first stop token).
    return TextPolicy(tok, lambda _prompt: next(replies))


async def test_two_turn_tool_episode_is_recorded_exactly(family):
    name, tok, case = family
    llm = ScriptedLLM(_policy(tok, case))
    loop = AgentLoop(
        llm,
        tok,
        LoopConfig(tool_parser=case.parser, reasoning_parser=case.reasoning_parser),
    )
    assert loop.strategy == case.strategy
    traj = await loop.run(AddEnv(), {}, episode_id=name)
    assert traj.stop_reason == StopReason.DONE, traj.error
    assert traj.reward == 1.0 and traj.num_turns == 2
    traj.validate()
    assert traj.strategy == case.strategy
    # The parsed call, run: the tool message holds its result.
    call = traj.messages[2].tool_calls[0]
    assert (call.name, call.arguments) == ("add", {"a": 2, "b": 3})
    assert [m.role for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert traj.messages[3].content == "5"

    chat = ChatTokenizer(tok, tools=[AddEnv().add.schema()], inject_tools=loop.inject_tools)
    model = [s for s in traj.spans if s.kind == "model"]
    sampled = [traj.token_ids[s.start : s.end] for s in model]
    assert [chat.decode(ids) for ids in sampled] == [case.call, case.answer]
    # Logprobs are the server's on sampled tokens, 0 elsewhere.
    for s in model:
        for i in range(s.start, s.end):
            assert traj.loss_mask[i] == 1
    assert sum(traj.loss_mask) == sum(len(x) for x in sampled)
    prompt = chat.prompt_ids(traj.messages[:2])
    between = traj.token_ids[model[0].end : model[1].start]
    assert chat.decode(between).startswith(case.result)
    if case.strategy == "as_sampled":
        # One sequence: prompt, turn 1, the tool result in the family's format, turn 2.
        assert traj.sample_starts == []
        assert traj.token_ids == prompt + sampled[0] + chat.encode(case.result) + sampled[1]
        assert chat.decode(between) == case.result
        assert llm.requests[1] == traj.token_ids[: model[1].start]
        for s in model:
            for i in range(s.start, s.end):
                assert traj.rollout_logprobs[i] == fake_logprob(traj.token_ids[i], i)
    else:
        # Two samples: each prompt is the template's rendering of the conversation so far,
        # exactly what inference shows; each is followed by the turn as sampled.
        second = chat.prompt_ids(traj.messages[:4])
        assert traj.sample_starts == [0, model[0].end]
        assert traj.token_ids == prompt + sampled[0] + second + sampled[1]
        assert llm.requests == [prompt, second]
        assert traj.position_ids()[model[0].end] == 0
        for s, start in zip(model, traj.sample_starts, strict=True):
            for i in range(s.start, s.end):
                assert traj.rollout_logprobs[i] == fake_logprob(traj.token_ids[i], i - start)
    if loop.inject_tools:
        assert '"name": "add"' in chat.decode(prompt) and "<tools>" in chat.decode(prompt)


async def test_as_sampled_works_for_every_family(family):
    # Forced as_sampled (e.g. to keep earlier reasoning): the model's turns stay as sampled
    # and each delta is exactly what the template renders for the new messages in that
    # position, i.e. the tail of the template's rendering of the conversation so far.
    name, tok, case = family
    cfg = LoopConfig(
        tool_parser=case.parser,
        reasoning_parser=case.reasoning_parser,
        template_strategy="as_sampled",
    )
    if not case.as_sampled_holds:
        with pytest.raises(TemplateError, match="as_sampled does not hold") as e:
            AgentLoop(ScriptedLLM(_policy(tok, case)), tok, cfg)
        assert "delta not isolated" in str(e.value)
        return
    loop = AgentLoop(ScriptedLLM(_policy(tok, case)), tok, cfg)
    traj = await loop.run(AddEnv(), {}, episode_id=name)
    assert traj.stop_reason == StopReason.DONE, traj.error
    assert traj.strategy == "as_sampled" and traj.sample_starts == []
    chat = ChatTokenizer(tok, tools=[AddEnv().add.schema()], inject_tools=loop.inject_tools)
    model = [s for s in traj.spans if s.kind == "model"]
    between = chat.decode(traj.token_ids[model[0].end : model[1].start])
    assert between and chat.render(traj.messages[:4], add_generation_prompt=True).endswith(between)
    sampled = [traj.token_ids[s.start : s.end] for s in model]
    prompt = chat.prompt_ids(traj.messages[:2])
    assert traj.token_ids == prompt + sampled[0] + chat.encode(between) + sampled[1]


@pytest.mark.parametrize("name", ["gpt_oss", "glm4_6"])
async def test_over_http_the_family_stop_tokens_reach_the_server(name):
    # gpt-oss ends a call on <|call|>, GLM on <|observation|>: neither is the tokenizer's eos,
    # so the loop sends them as stop tokens; over real HTTP the scripted server stops there.
    from agentrl.inference.client import CompletionsClient
    from agentrl.testing.scripted_server import ScriptedServer

    tok, case = family_tokenizer(name), CASES[name]
    cfg = LoopConfig(tool_parser=case.parser, reasoning_parser=case.reasoning_parser)
    with ScriptedServer(_policy(tok, case)) as srv:
        async with CompletionsClient(srv.url) as client:
            traj = await AgentLoop(client, tok, cfg).run(AddEnv(), {}, episode_id=name)
    assert traj.stop_reason == StopReason.DONE, traj.error
    stop = tok.convert_tokens_to_ids("<|call|>" if name == "gpt_oss" else "<|observation|>")
    assert stop in srv.requests[0]["stop_token_ids"]
    first = next(s for s in traj.spans if s.kind == "model")
    assert traj.token_ids[first.end - 1] == stop
    assert traj.messages[3].content == "5" and traj.sample_starts == [0, first.end]


def test_delta_without_the_turn_pairs_results_with_calls_named_after_them(family):
    # Callers that do not know the model's turn (the gateway) get the same tool-result
    # delta: harmony's "functions.add to=assistant" needs the call's name, Llama's
    # ipython turn a preceding call, Mistral a 9-character id.
    _, tok, _ = family
    chat = ChatTokenizer(tok, tools=[AddEnv().add.schema()])
    new = [Message.tool("5", tool_call_id="call_0", name="add")]
    turn = Message.assistant("", (ToolCall("add", {"a": 2, "b": 3}, id="call_0"),))
    assert chat.delta_text(new) == chat.delta_text(new, after=turn)


async def test_per_turn_episode_cut_by_the_turn_budget_has_one_sample_per_turn():
    class GoOn(Env):
        def reset(self, task, *, seed=None):
            return [Message.user("Count.")]

        def step(self, action):
            return StepResult(observation=[Message.user("Go on.")])

    tok = family_tokenizer("qwen3")
    loop = AgentLoop(ScriptedLLM(TextPolicy(tok, lambda _: "1")), tok, LoopConfig(max_turns=3))
    traj = await loop.run(GoOn(), {})
    assert traj.stop_reason == StopReason.MAX_TURNS and traj.num_turns == 3
    assert len(traj.sample_starts) == 3  # no trailing prompt-only sample
    assert traj.spans[-1].kind == "model"


async def test_per_turn_prompt_over_the_context_budget_ends_the_episode_without_it():
    class GoOn(Env):
        def reset(self, task, *, seed=None):
            return [Message.user("Count.")]

        def step(self, action):
            return StepResult(observation=[Message.user("Go on. " * 40)])

    tok = family_tokenizer("qwen3")
    cfg = LoopConfig(max_turns=3, max_total_tokens=120)
    traj = await AgentLoop(ScriptedLLM(TextPolicy(tok, lambda _: "1")), tok, cfg).run(GoOn(), {})
    assert traj.stop_reason == StopReason.MAX_TOKENS and traj.num_turns == 1
    assert traj.sample_starts == [] and traj.spans[-1].kind == "model"
