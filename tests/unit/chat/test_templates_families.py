"""Published chat-template families, end to end: doctor verdict and strategy, a two-turn
tool episode through the AgentLoop with the family's own tool-call text, the parsed
call, the tool result rendered in the family's format, and the exact token sequence.

Templates are written from each family's public format (tests/data/templates/);
the tokenizer is a small BPE trained here with each family's special tokens.
"""

from __future__ import annotations

import pytest

from agentrl import Env, Message, StepResult, StopReason
from agentrl.chat.templates import inspect_template
from agentrl.rollout import AgentLoop, ChatTokenizer, LoopConfig, TemplateError
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy, fake_logprob
from agentrl.types import ToolCall
from tests.data.templates.families import family_tokenizer
from tests.helpers.agent_loop import AddEnv
from tests.helpers.templates import CASES, Case


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
