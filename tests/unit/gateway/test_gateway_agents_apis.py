"""Agents as users write them, run by AgentRunner: a sync ``solve`` (in a thread, with a sync
client), an Anthropic client asked for by annotation, an ``openai-agents`` agent on its
default (Responses) model; ``tool_choice`` that forces a call; a first prompt over the
token budget."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from agentrl.gateway import AgentRunner, Gateway, load_agent
from agentrl.gateway.agent_runner import client_kind
from agentrl.types import StopReason
from tests.helpers.gateway import (
    ANTHROPIC_TOOLS,
    CALL,
    RESPONSES_TOOLS,
    TOOLS,
    Recording,
    limits,
    model_tokens,
    openai_client,
    started,
    tool_then_answer,
)
from tests.helpers.paths import REPO

TRANSPORTS = pytest.mark.parametrize("transport", ["http", "in_process"])


async def run(tokenizer: Any, solve: Any, reply: Any = tool_then_answer, **kw: Any) -> Any:
    runner_kw = {k: kw.pop(k) for k in ("transport", "episode_timeout_s") if k in kw}
    async with started(tokenizer, reply, **kw) as (gw, rec):
        traj = await AgentRunner(gw, solve, **runner_kw).run_episode({"id": "t", "q": "2+2?"})
        assert not gw.sessions
    return traj, rec


# ---------------------------------------------------------------------- sync solve


@TRANSPORTS
async def test_a_sync_solve_runs_in_a_thread_with_a_sync_client(tokenizer, transport):
    seen: dict[str, Any] = {}

    def solve(task, client):
        seen["client"], seen["thread"] = client, threading.current_thread()
        msgs: list[dict[str, Any]] = [{"role": "user", "content": task["q"]}]
        r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        call = r.choices[0].message.tool_calls[0]
        msgs += [
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "4"},
        ]
        r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        return float("4" in r.choices[0].message.content)

    traj, rec = await run(tokenizer, solve, transport=transport)
    assert isinstance(seen["client"], openai.OpenAI)
    assert seen["thread"] is not threading.main_thread()
    assert traj.stop_reason == StopReason.DONE and traj.reward == 1.0 and traj.num_turns == 2
    assert len(rec.prompts) == 2 and traj.metrics["gateway/segments"] == 1.0


async def test_a_sync_solve_may_build_its_own_client_from_the_base_url(tokenizer):
    def solve(task, client):
        own = openai.OpenAI(base_url=str(client.base_url), api_key="x", max_retries=0)
        r = own.responses.create(model="m", input=task["q"], tools=RESPONSES_TOOLS)
        own.close()
        return float(r.output[-1].type == "function_call")

    traj, _ = await run(tokenizer, solve)  # over real HTTP, while the loop serves it
    assert traj.stop_reason == StopReason.DONE and traj.reward == 1.0


async def test_a_sync_solve_that_raises_or_hangs_ends_its_episode(tokenizer):
    def bad(task, client):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        raise KeyError("my agent's bug")

    traj, _ = await run(tokenizer, bad)
    assert traj.stop_reason == StopReason.AGENT_ERROR and "my agent's bug" in traj.error

    release = threading.Event()

    def hang(task, client):
        release.wait(10)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])

    traj, _ = await run(tokenizer, hang, episode_timeout_s=0.3)
    assert traj.stop_reason == StopReason.TIMEOUT
    release.set()  # the thread's late request finds its session closed, and ends


@TRANSPORTS
async def test_an_anthropic_annotation_gets_an_anthropic_client(tokenizer, transport):
    async def solve(task, client: anthropic.AsyncAnthropic):
        msgs: list[dict[str, Any]] = [{"role": "user", "content": task["q"]}]
        m = await client.messages.create(
            model="m", max_tokens=100, messages=msgs, tools=ANTHROPIC_TOOLS
        )
        use = m.content[-1]
        msgs += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "4"}
            ]},
        ]  # fmt: skip
        m = await client.messages.create(
            model="m", max_tokens=100, messages=msgs, tools=ANTHROPIC_TOOLS
        )
        return float("4" in m.content[0].text)

    def sync_solve(task, client: "anthropic.Anthropic"):  # noqa: UP037 (a string, on purpose)
        m = client.messages.create(
            model="m", max_tokens=100, messages=[{"role": "user", "content": task["q"]}]
        )
        return float(m.stop_reason == "end_turn")

    assert client_kind(solve) == ("anthropic", True)
    assert client_kind(sync_solve) == ("anthropic", False)
    traj, _ = await run(tokenizer, solve, transport=transport)
    assert traj.stop_reason == StopReason.DONE and traj.reward == 1.0 and traj.num_turns == 2
    traj, _ = await run(tokenizer, sync_solve, reply=lambda p: "four", transport=transport)
    assert traj.stop_reason == StopReason.DONE and traj.reward == 1.0


def test_load_agent_takes_sync_agents(tmp_path):
    sync = tmp_path / "sync_agent.py"
    sync.write_text("def solve(task, client):\n    return 1.0\n")
    solve, score = load_agent(f"{sync}:solve")
    assert client_kind(solve) == ("openai", False) and score is None


# ---------------------------------------------------------------------- openai-agents


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_openai_agents_agent_on_its_default_model(tokenizer, streamed):
    import agents

    agents.set_tracing_disabled(True)

    @agents.function_tool
    def python(code: str) -> str:
        """Runs code."""
        return "4"

    async def solve(task, client):
        agent = agents.Agent(name="calc", instructions="Use python.", tools=[python])
        config = agents.RunConfig(model_provider=agents.OpenAIProvider(openai_client=client))
        if streamed:
            result = agents.Runner.run_streamed(agent, task["q"], run_config=config)
            async for _ in result.stream_events():
                pass
        else:
            result = await agents.Runner.run(agent, task["q"], run_config=config)
        return float("4" in result.final_output)

    traj, rec = await run(tokenizer, solve)
    assert traj.stop_reason == StopReason.DONE and traj.reward == 1.0, traj.error
    assert traj.num_turns == 2 and traj.metrics["gateway/segments"] == 1.0
    assert rec.prompts[1][: len(rec.prompts[0])] == rec.prompts[0]  # one exact sequence


async def test_an_agent_that_raises_on_a_reply_cut_by_the_budget_ends_as_max_tokens(tokenizer):
    import agents

    agents.set_tracing_disabled(True)

    async def solve(task, client):  # openai-agents raises on an incomplete response
        agent = agents.Agent(name="a", instructions="Answer.")
        config = agents.RunConfig(model_provider=agents.OpenAIProvider(openai_client=client))
        await agents.Runner.run(agent, task["q"], run_config=config)
        return 1.0

    async def own_cap(task, client):  # the agent's own max_output_tokens: its own doing
        r = await client.responses.create(model="m", input="q", max_output_tokens=2)
        raise RuntimeError(f"status {r.status}")

    rambling = {"reply": lambda p: "word " * 100, "max_tokens_per_turn": 8}
    traj, _ = await run(tokenizer, solve, **rambling)
    assert traj.stop_reason == StopReason.MAX_TOKENS and traj.reward == 0.0
    assert "cut by the run's token budget" in traj.error and traj.num_model_tokens == 8
    traj, _ = await run(tokenizer, own_cap, **rambling)
    assert traj.stop_reason == StopReason.AGENT_ERROR


# ---------------------------------------------------------------------- tool_choice


def scripted(*replies: str) -> Any:
    """A reply function giving ``replies`` in order (the last one from then on)."""
    it: Iterator[str] = iter(replies)
    last = [replies[-1]]

    def reply(prompt: str) -> str:
        last[0] = next(it, last[0])
        return last[0]

    return reply


async def test_required_tool_choice_resamples_until_a_call(tokenizer):
    async with started(tokenizer, scripted("no tool", "still none", CALL)) as (gw, rec):
        session = gw.open_session("s")
        client = openai_client(gw, session)
        msgs = [{"role": "user", "content": "q"}]
        r = await client.chat.completions.create(
            model="m", messages=msgs, tools=TOOLS, tool_choice="required"
        )
        await client.close()
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.tool_calls[0].function.name == "python"
    assert len(rec.prompts) == 3 and rec.prompts[0] == rec.prompts[1] == rec.prompts[2]
    assert session.metrics["gateway/tool_choice_resamples"] == 2.0
    traj = session.trajectory(task_id="t", group_id="g", reward=0.0, stop_reason="done")
    # Only the accepted sample is recorded: its tokens, exactly.
    expected = [*tokenizer.encode(CALL, add_special_tokens=False), tokenizer.eos_token_id]
    assert model_tokens(traj) == expected and traj.num_turns == 1


async def test_a_named_function_resamples_and_an_unmet_choice_keeps_the_last_sample(tokenizer):
    other = CALL.replace('"python"', '"other"')
    two = [*TOOLS, {"type": "function", "function": {"name": "other", "parameters": {}}}]
    named = {"type": "function", "function": {"name": "python"}}
    async with started(
        tokenizer, scripted(other, CALL, "no", "no"), forced_tool_choice_tries=2
    ) as (gw, rec):  # fmt: skip
        session = gw.open_session("s")
        client = openai_client(gw, session)
        msgs = [{"role": "user", "content": "q"}]
        r = await client.chat.completions.create(
            model="m", messages=msgs, tools=two, tool_choice=named
        )
        assert r.choices[0].message.tool_calls[0].function.name == "python"
        r = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "other"}], tools=two,
            tool_choice="required",
        )  # fmt: skip
        await client.close()
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == "no"
    assert session.metrics["gateway/tool_choice_unmet"] == 1.0 and len(rec.prompts) == 4


async def test_prefill_opens_the_turn_with_the_untrained_call_tag(tokenizer):
    body = CALL.removeprefix("<tool_call>")

    def reply(prompt: str) -> str:  # the model continues what the gateway opened
        return body if prompt.endswith("<tool_call>") else "no tool"

    async with started(tokenizer, reply, forced_tool_choice="prefill") as (gw, rec):
        session = gw.open_session("s")
        client = openai_client(gw, session)
        r = await client.responses.create(
            model="m", input="q", tools=RESPONSES_TOOLS, tool_choice="required"
        )
        await client.close()
    assert r.output[-1].type == "function_call" and r.output[-1].name == "python"
    tag = tokenizer.encode("<tool_call>", add_special_tokens=False)
    assert rec.prompts[0][-len(tag) :] == tag and len(rec.prompts) == 1
    seg = session.segments[0]
    [span] = [sp for sp in seg.spans if sp.kind == "model"]
    turn = seg.token_ids[span.start : span.end]
    sampled = [*tokenizer.encode(body, add_special_tokens=False), tokenizer.eos_token_id]
    assert turn == tag + sampled
    assert seg.loss_mask[span.start : span.end] == [0] * len(tag) + [1] * len(sampled)
    assert seg.versions[span.start] == -1 and r.usage.output_tokens == len(sampled)


async def test_anthropic_any_forces_a_call(tokenizer):
    async with started(tokenizer, scripted("no tool", CALL)) as (gw, _rec):
        session = gw.open_session("s")
        client = anthropic.AsyncAnthropic(
            base_url=gw.anthropic_base_url(session), api_key="-", max_retries=0
        )
        m = await client.messages.create(
            model="m", max_tokens=100, messages=[{"role": "user", "content": "q"}],
            tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"},
        )  # fmt: skip
        await client.close()
    assert m.stop_reason == "tool_use" and session.metrics["gateway/tool_choice_resamples"] == 1


# ---------------------------------------------------------------------- token budget


async def test_a_first_prompt_over_the_budget_stops_the_episode_naming_the_setting(tokenizer):
    long_prompt = "word " * 200

    async def solve(task, client):
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": long_prompt}]
        )
        return 1.0

    llm = Recording(lambda *a: [])  # never called
    lim = limits(max_total_tokens=64, max_model_len=4096)
    async with Gateway(llm, tokenizer, lim) as gw:
        traj = await AgentRunner(gw, solve).run_episode({"id": "t"})
        session = gw.open_session("direct")
        client = anthropic.AsyncAnthropic(
            base_url=gw.anthropic_base_url(session), api_key="-", max_retries=0
        )
        with pytest.raises(anthropic.BadRequestError, match=r"rollout\.max_total_tokens"):
            await client.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": long_prompt}]
            )
        await client.close()
        oai = openai_client(gw, session)
        with pytest.raises(openai.BadRequestError) as e:
            await oai.responses.create(model="m", input=long_prompt)
        await oai.close()
    assert e.value.code == "context_length_exceeded"
    assert traj.stop_reason == StopReason.MAX_TOKENS  # not agent_error: the gateway stopped it
    assert "rollout.max_total_tokens=64" in traj.error
    assert "inference.max_model_len (now 4096)" in traj.error and "BadRequestError" in traj.error
    assert not traj.num_model_tokens and not llm.prompts
    assert session.stop_reason == StopReason.MAX_TOKENS and session.fatal


def test_example_agents_load(tmp_path):
    for name, kind in [
        ("openai_agents_agent.py", ("openai", True)),
        ("anthropic_agent.py", ("anthropic", True)),
    ]:
        solve, score = load_agent(f"{REPO / 'examples' / 'byo_agent' / name}:solve")
        assert client_kind(solve) == kind and score is not None
