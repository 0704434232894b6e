"""The gateway over real HTTP on 127.0.0.1, driven by the real ``openai.AsyncOpenAI`` client.

Generations come from the scripted policy (in process, or the scripted HTTP server
behind the real CompletionsClient), so every token and logprob is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx
import openai
import pytest

from agentrl.gateway.server import Gateway
from agentrl.gateway.session import GatewayLimits
from agentrl.gateway.transport import in_process_client
from agentrl.inference.protocol import LLMError
from agentrl.rollout import LoopConfig
from agentrl.testing.scripted_server import ScriptedServer, TextPolicy, fake_logprob
from agentrl.types import StopReason
from tests.helpers.gateway import CALL, TOOLS, Recording


def tool_then_answer(prompt: str) -> str:
    """Calls python first; answers once a tool response is in the last user turn."""
    if "<tool_response>" in prompt.rsplit("<|im_start|>user", 1)[-1]:
        return "The answer is \\boxed{4}"
    return "Let me run it.\n" + CALL


def _limits(**kw: Any) -> GatewayLimits:
    """GatewayLimits from flat keywords: LoopConfig's fields go to ``loop``."""
    names = {f.name for f in dataclasses.fields(LoopConfig)}
    loop = LoopConfig(**{k: v for k, v in kw.items() if k in names})
    return GatewayLimits(loop=loop, **{k: v for k, v in kw.items() if k not in names})


@contextlib.asynccontextmanager
async def gateway(
    tokenizer: Any, reply: Callable[[str], str] = tool_then_answer, llm: Any = None,
    transport: str = "http", **limits: Any,
) -> AsyncIterator[tuple[Gateway, Recording, Any]]:  # fmt: skip
    """A started gateway, its LLM double, and a session with its openai client (over
    HTTP, or in process as AgentRunner's clients are)."""
    rec = llm or Recording(TextPolicy(tokenizer, reply))
    async with Gateway(rec, tokenizer, _limits(**limits)) as gw:
        session = gw.open_session("ep-0")
        client = _client(gw, gw.base_url(session), transport)
        try:
            yield gw, rec, (session, client)
        finally:
            await client.close()


def _client(gw: Gateway, base_url: str, transport: str) -> openai.AsyncOpenAI:
    http = in_process_client(gw) if transport == "in_process" else None
    return openai.AsyncOpenAI(base_url=base_url, api_key="-", max_retries=0, http_client=http)


TRANSPORTS = pytest.mark.parametrize("transport", ["http", "in_process"])


def render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


@TRANSPORTS
async def test_tool_call_round_trip_records_the_template_tokens_exactly(tokenizer, transport):
    async with gateway(tokenizer, transport=transport) as (_gw, rec, (session, client)):
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "2+2?"}]
        r1 = await client.chat.completions.create(model="any", messages=msgs, tools=TOOLS)
        c1 = r1.choices[0]
        assert c1.finish_reason == "tool_calls"
        assert c1.message.content == "Let me run it."
        [call] = c1.message.tool_calls
        assert call.function.name == "python"
        assert json.loads(call.function.arguments) == {"code": "print(2+2)"}
        msgs.append(c1.message.model_dump(exclude_none=True))
        msgs.append({"role": "tool", "tool_call_id": call.id, "content": "4"})
        r2 = await client.chat.completions.create(model="any", messages=msgs, tools=TOOLS)
        assert r2.choices[0].finish_reason == "stop"
        assert r2.choices[0].message.content == "The answer is \\boxed{4}"
        msgs.append({"role": "assistant", "content": r2.choices[0].message.content})

        traj = session.trajectory(task_id="t", group_id="g", reward=1.0, stop_reason="done")
    # The second prompt is the first one, the sampled ids, then only the tool delta.
    first, second = rec.prompts
    sampled = traj.token_ids[len(first) : len(first) + traj.spans[1].end - traj.spans[1].start]
    assert second[: len(first) + len(sampled)] == first + sampled
    # With this prefix-consistent template, that equals rendering the whole conversation.
    full = render(tokenizer, msgs, TOOLS)
    assert traj.token_ids == full[: len(traj)] and tokenizer.decode(full[len(traj) :]) == "\n"
    # Tool results went through the template (one user turn with a <tool_response> block).
    assert "<tool_response>\n4\n</tool_response>" in tokenizer.decode(second)
    model = [i for i, m in enumerate(traj.loss_mask) if m]
    assert [traj.token_ids[i] for i in model] == sampled + traj.token_ids[len(second) :]
    assert [traj.rollout_logprobs[i] for i in model] == [
        fake_logprob(traj.token_ids[i], i) for i in model
    ]
    assert all(traj.weight_versions[i] == 0 for i in model)
    assert traj.reward == 1.0 and traj.num_turns == 2 and traj.prompt_length == len(first)


class FixedIds:
    """Answers with fixed token ids (then eos), whatever the prompt."""

    def __init__(self, ids: list[int], eos_id: int) -> None:
        self.ids, self.eos_id = ids, eos_id

    def __call__(self, prompt_ids: Sequence[int], max_tokens: int, seed: int | None) -> list[int]:
        return [*self.ids, self.eos_id]


async def test_earlier_turns_are_the_sampled_ids_never_retokenized(tokenizer):
    # One character per token: decoding then encoding gives other (merged) ids.
    ids = [tokenizer.convert_tokens_to_ids(c) for c in "hello"]
    assert list(tokenizer.encode("hello", add_special_tokens=False)) != ids
    rec = Recording(FixedIds(ids, tokenizer.eos_token_id))
    async with gateway(tokenizer, llm=rec) as (_gw, _rec, (_s, client)):
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        r = await client.chat.completions.create(model="m", messages=msgs)
        assert r.choices[0].message.content == "hello"
        msgs += [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
        await client.chat.completions.create(model="m", messages=msgs)
    first, second = rec.prompts
    assert second[len(first) : len(first) + 6] == [*ids, tokenizer.eos_token_id]
    assert render(tokenizer, msgs)[len(first) : len(first) + 5] != ids  # re-tokenized differs


@TRANSPORTS
async def test_streaming_returns_content_and_tool_calls(tokenizer, transport):
    async with gateway(tokenizer, transport=transport) as (_gw, _rec, (_s, client)):
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "2+2?"}]
        stream = await client.chat.completions.create(
            model="m", messages=msgs, tools=TOOLS, stream=True,
            stream_options={"include_usage": True}, logprobs=True,
        )  # fmt: skip
        content, calls, finish, usage, lps = "", [], None, None, []
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for ch in chunk.choices:
                content += ch.delta.content or ""
                calls += ch.delta.tool_calls or []
                finish = ch.finish_reason or finish
                if ch.logprobs and ch.logprobs.content:
                    lps += [t.logprob for t in ch.logprobs.content]
        assert content == "Let me run it."
        assert [c.function.name for c in calls] == ["python"]
        assert json.loads(calls[0].function.arguments) == {"code": "print(2+2)"}
        assert finish == "tool_calls"
        assert usage is not None and usage.completion_tokens > 0
        assert len(lps) == usage.completion_tokens  # logprobs of every sampled token


async def test_rewritten_history_starts_a_counted_new_segment(tokenizer):
    async with gateway(tokenizer, reply=lambda p: "ok") as (_gw, rec, (session, client)):
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "first question"},
        ]
        r = await client.chat.completions.create(model="m", messages=msgs)
        msgs += [r.choices[0].message.model_dump(exclude_none=True)]
        msgs += [{"role": "user", "content": "second"}]
        await client.chat.completions.create(model="m", messages=msgs)  # extends: same segment
        summary = [msgs[0], {"role": "user", "content": "summary of earlier turns; third"}]
        await client.chat.completions.create(model="m", messages=summary)  # rewrite
        traj = session.trajectory(task_id="t", group_id="g", reward=0.5, stop_reason="done")
    first = session.segments[0]
    # One episode, one Trajectory: the segments are its samples (positions restart at each).
    assert traj.sample_starts == [0, len(first.token_ids)]
    assert traj.metrics["gateway/segments"] == 2.0 and traj.metrics["gateway/rewrites"] == 1.0
    assert traj.num_turns == 3 and traj.reward == 0.5 and traj.group_id == "g"
    assert traj.position_ids()[len(first.token_ids)] == 0
    # The new segment is the fresh rendering of the rewritten messages, not a continuation.
    assert rec.prompts[2] == render(tokenizer, summary) + tokenizer.encode(
        "<|im_start|>assistant\n", add_special_tokens=False
    )
    assert traj.token_ids[len(first.token_ids) :][: len(rec.prompts[2])] == rec.prompts[2]
    assert traj.token_ids[: len(first.token_ids)] == first.token_ids  # kept as it was
    assert [m.content for m in traj.messages][:2] == ["Be brief.", summary[1]["content"]]
    assert len(traj.info["segment_messages"]) == 1


async def test_edited_assistant_message_is_a_rewrite(tokenizer):
    async with gateway(tokenizer, reply=lambda p: "ok") as (_gw, _rec, (session, client)):
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
        await client.chat.completions.create(model="m", messages=msgs)
        msgs += [{"role": "assistant", "content": "not what the model said"}]
        msgs += [{"role": "user", "content": "next"}]
        await client.chat.completions.create(model="m", messages=msgs)
    assert len(session.segments) == 2 and session.metrics["gateway/rewrites"] == 1.0


async def test_sampling_parameters_are_honoured_within_the_limits(tokenizer):
    limits = {"max_temperature": 0.7, "max_tokens_per_turn": 20}
    async with gateway(tokenizer, reply=lambda p: "ok", **limits) as (_gw, rec, (session, c)):
        msgs = [{"role": "user", "content": "q"}]
        await c.chat.completions.create(
            model="m", messages=msgs, temperature=0.3, top_p=0.5, max_tokens=5, seed=7
        )
        await c.chat.completions.create(model="m", messages=msgs, temperature=1.9, max_tokens=500)
        await c.chat.completions.create(model="m", messages=msgs, max_completion_tokens=3)
    p = rec.params
    assert (p[0].temperature, p[0].top_p, p[0].max_tokens, p[0].seed) == (0.3, 0.5, 5, 7)
    assert (p[1].temperature, p[1].max_tokens) == (0.7, 20)  # clamped to the run's limits
    assert p[2].max_tokens == 3
    assert session.metrics["gateway/clamped_params"] == 2.0


async def test_request_after_the_token_budget_gets_a_length_finish(tokenizer):
    async with gateway(
        tokenizer, reply=lambda p: "word " * 100, max_total_tokens=60, max_tokens_per_turn=40
    ) as (_gw, rec, (session, client)):
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
        r1 = await client.chat.completions.create(model="m", messages=msgs)
        assert r1.choices[0].finish_reason == "length"  # cut by the context budget
        msgs += [{"role": "assistant", "content": r1.choices[0].message.content}]
        msgs += [{"role": "user", "content": "more"}]
        r2 = await client.chat.completions.create(model="m", messages=msgs)
        assert r2.choices[0].finish_reason == "length" and r2.choices[0].message.content == ""
        assert len(rec.prompts) == 1  # nothing was generated past the budget
        assert session.stop_reason == StopReason.MAX_TOKENS


async def test_turn_budget_gives_length_finishes(tokenizer):
    async with gateway(tokenizer, reply=lambda p: "ok", max_turns=1) as (_gw, rec, (s, client)):
        msgs = [{"role": "user", "content": "q"}]
        for _ in range(2):
            r = await client.chat.completions.create(model="m", messages=msgs)
        assert r.choices[0].finish_reason == "length" and len(rec.prompts) == 1
        assert s.stop_reason == StopReason.MAX_TURNS


async def test_stop_strings_cut_the_turn_and_it_is_closed_as_the_template_would(tokenizer):
    async with gateway(tokenizer, reply=lambda p: "Act: ls\nObservation: x") as (
        _gw, rec, (session, client),
    ):  # fmt: skip
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
        r = await client.chat.completions.create(model="m", messages=msgs, stop=["Observation:"])
        assert r.choices[0].message.content == "Act: ls\n"
        assert r.choices[0].finish_reason == "stop"
        msgs += [{"role": "assistant", "content": "Act: ls\n"}, {"role": "user", "content": "x"}]
        await client.chat.completions.create(model="m", messages=msgs, stop=["Observation:"])
    seg = session.segments[0]
    model = [seg.token_ids[sp.start : sp.end] for sp in seg.spans if sp.kind == "model"]
    assert tokenizer.decode(model[0]).startswith("Act: ls\nObservation:")
    eot = tokenizer.eos_token_id
    assert model[0][-1] != eot and rec.prompts[1][len(rec.prompts[0]) + len(model[0])] == eot
    assert seg.loss_mask[len(rec.prompts[0]) + len(model[0])] == 0  # the closing eot: not sampled


async def test_text_completions_reuse_the_recorded_ids(tokenizer):
    async with gateway(tokenizer, reply=lambda p: " world") as (_gw, rec, (session, client)):
        r1 = await client.completions.create(model="m", prompt="hello", logprobs=1)
        assert r1.choices[0].text == " world" and r1.choices[0].finish_reason == "stop"
        assert len(r1.choices[0].logprobs.token_logprobs) == r1.usage.completion_tokens
        stream = await client.completions.create(
            model="m", prompt="hello world and more", stream=True
        )
        assert "".join([c.choices[0].text async for c in stream]) == " world"
        await client.completions.create(model="m", prompt="something else")
    first, second = rec.prompts[:2]
    sampled = session.segments[0].token_ids[len(first) : len(first) + r1.usage.completion_tokens]
    assert second[: len(first) + len(sampled)] == first + sampled
    assert len(session.segments) == 2  # the unrelated prompt is a new segment


@TRANSPORTS
async def test_errors_are_openai_error_bodies_the_client_raises(tokenizer, transport):
    async with gateway(tokenizer, reply=lambda p: "ok", transport=transport) as (
        gw, _rec, (session, client),
    ):  # fmt: skip
        msgs = [{"role": "user", "content": "q"}]
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="m", messages=msgs, presence_penalty=0.5)
        assert "presence_penalty" in str(e.value) and e.value.body["param"] == "presence_penalty"
        with pytest.raises(openai.BadRequestError, match="not among the tools"):
            await client.chat.completions.create(
                model="m", messages=msgs, tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "nope"}},
            )  # fmt: skip
        with pytest.raises(openai.BadRequestError, match="'n' must be 1"):
            await client.chat.completions.create(model="m", messages=msgs, n=2)
        with pytest.raises(openai.BadRequestError, match="unsupported parameter 'foo'"):
            await client.chat.completions.create(model="m", messages=msgs, extra_body={"foo": 1})
        with pytest.raises(openai.BadRequestError, match="only text content parts"):
            await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            )
        async with httpx.AsyncClient() as http:
            bad = await http.post(
                gw.base_url(session) + "/chat/completions", content=b"{not json",
                headers={"content-type": "application/json"},
            )  # fmt: skip
        assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
        assert session.metrics["gateway/errors_400"] == 6.0
        other = _client(gw, gw.base_url(session).replace(session.token, "nope"), transport)
        with pytest.raises(openai.NotFoundError, match="unknown session"):
            await other.chat.completions.create(model="m", messages=msgs)
        await other.close()
        models = await client.models.list()
        assert [m.id for m in models.data] == ["agentrl-policy"]
        gw.close_session(session)
        with pytest.raises(openai.NotFoundError):  # a request after its episode ended
            await client.chat.completions.create(model="m", messages=msgs)


async def test_inference_failure_is_a_5xx_and_ends_the_episode_with_llm_error(tokenizer):
    rec = Recording(TextPolicy(tokenizer, lambda p: "ok"))
    rec.fail = LLMError("all servers down")
    async with gateway(tokenizer, llm=rec) as (gw, _rec, (session, client)):
        with pytest.raises(openai.InternalServerError, match="all servers down"):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "q"}]
            )
        assert session.stop_reason == StopReason.LLM_ERROR
        rec.fail = RuntimeError("a bug")  # not an LLMError: still an answer, never a crash
        with pytest.raises(openai.InternalServerError, match="internal gateway error"):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "q"}]
            )
        async with httpx.AsyncClient() as http:  # the server is still up for everyone else
            assert (await http.get(f"http://{gw.host}:{gw.port}/health")).status_code == 200


async def test_concurrent_sessions_are_isolated_over_the_scripted_http_server(tokenizer):
    from agentrl.inference.client import CompletionsClient

    def reply(prompt: str) -> str:
        return "echo " + prompt.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>")[0]

    with ScriptedServer(TextPolicy(tokenizer, reply)) as srv:
        async with CompletionsClient(srv.url) as llm, Gateway(llm, tokenizer) as gw:

            async def episode(k: int) -> tuple[Any, list[str]]:
                s = gw.open_session(f"ep-{k}")
                c = openai.AsyncOpenAI(base_url=gw.base_url(s), api_key="-", max_retries=0)
                msgs: list[dict[str, Any]] = []
                out = []
                for turn in range(3):
                    msgs.append({"role": "user", "content": f"{k}-{turn}"})
                    r = await c.chat.completions.create(model="m", messages=msgs)
                    out.append(r.choices[0].message.content)
                    msgs.append({"role": "assistant", "content": out[-1]})
                await c.close()
                gw.close_session(s)
                return s, out

            results = await asyncio.gather(*(episode(k) for k in range(32)))
    for k, (s, out) in enumerate(results):
        assert out == [f"echo {k}-{t}" for t in range(3)]
        assert len(s.segments) == 1 and s.segments[0].turns == 3
    assert not gw.sessions
