"""OpenAI's Responses API on the gateway, driven by the real ``openai`` client's
``client.responses`` (plain, streamed, and its ``responses.stream`` helper) over HTTP and in
process: the same exact-token record as chat/completions, tool calls both ways,
``previous_response_id``, and errors the client raises."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from agentrl.testing.scripted_server import fake_logprob
from tests.helpers.gateway import (
    RESPONSES_TOOLS,
    TOOLS,
    model_tokens,
    openai_client,
    started,
)

TRANSPORTS = pytest.mark.parametrize("transport", ["http", "in_process"])
SYSTEM = "Be brief."


async def chat_episode(gw: Any) -> Any:
    """The tool round trip over chat/completions: the record the Responses API must match."""
    session = gw.open_session("chat")
    client = openai_client(gw, session)
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "2+2?"},
    ]
    r = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
    call = r.choices[0].message.tool_calls[0]
    msgs += [
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "4"},
    ]
    await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
    await client.close()
    return session.trajectory(task_id="t", group_id="g", reward=1.0, stop_reason="done")


def same_record(a: Any, b: Any) -> bool:
    return (a.token_ids, a.loss_mask, a.rollout_logprobs, a.weight_versions, a.spans) == (
        b.token_ids, b.loss_mask, b.rollout_logprobs, b.weight_versions, b.spans,
    )  # fmt: skip


@TRANSPORTS
async def test_tool_call_round_trip_records_what_chat_completions_records(tokenizer, transport):
    async with started(tokenizer) as (gw, rec):
        session = gw.open_session("responses")
        client = openai_client(gw, session, transport)
        r1 = await client.responses.create(
            model="m", instructions=SYSTEM, input="2+2?", tools=RESPONSES_TOOLS
        )
        assert r1.status == "completed" and [o.type for o in r1.output] == [
            "message", "function_call",
        ]  # fmt: skip
        assert r1.output_text == "Let me run it."
        call = r1.output[1]
        assert call.name == "python" and json.loads(call.arguments) == {"code": "print(2+2)"}
        # The next request sends the output items back (as openai-agents does) and the result.
        items = [
            {"role": "user", "content": "2+2?"},
            *[o.model_dump(exclude_none=True) for o in r1.output],
            {"type": "function_call_output", "call_id": call.call_id, "output": "4"},
        ]
        r2 = await client.responses.create(
            model="m", instructions=SYSTEM, input=items, tools=RESPONSES_TOOLS
        )
        assert r2.output_text == "The answer is \\boxed{4}" and r2.status == "completed"
        assert r2.usage.input_tokens == len(rec.prompts[1])
        await client.close()
        traj = session.trajectory(task_id="t", group_id="g", reward=1.0, stop_reason="done")
        reference = await chat_episode(gw)
    assert traj.metrics["gateway/segments"] == 1.0 and "gateway/rewrites" not in traj.metrics
    assert traj.metrics["gateway/api_responses"] == 2.0
    assert same_record(traj, reference)
    # The second prompt is the first, its sampled ids, and the tool result's delta.
    first, second = rec.prompts[:2]
    sampled = model_tokens(traj)[: r1.usage.output_tokens]
    assert second[: len(first) + len(sampled)] == first + sampled
    model = [i for i, m in enumerate(traj.loss_mask) if m]
    assert [traj.rollout_logprobs[i] for i in model] == [
        fake_logprob(traj.token_ids[i], i) for i in model
    ]
    assert r1.usage.output_tokens + r2.usage.output_tokens == len(model)
    assert session.conversation[-1] == {"role": "assistant", "content": r2.output_text}


async def test_previous_response_id_continues_the_session(tokenizer):
    async with started(tokenizer) as (gw, rec):
        session = gw.open_session("responses")
        client = openai_client(gw, session)
        r1 = await client.responses.create(
            model="m", instructions=SYSTEM, input="2+2?", tools=RESPONSES_TOOLS
        )
        result = {"type": "function_call_output", "call_id": r1.output[1].call_id, "output": "4"}
        r2 = await client.responses.create(
            model="m", instructions=SYSTEM, previous_response_id=r1.id, input=[result],
            tools=RESPONSES_TOOLS,
        )  # fmt: skip
        assert r2.previous_response_id == r1.id
        assert r2.output_text == "The answer is \\boxed{4}"
        traj = session.trajectory(task_id="t", group_id="g", reward=1.0, stop_reason="done")
        with pytest.raises(openai.NotFoundError, match="previous response 'resp_nope'"):
            await client.responses.create(model="m", previous_response_id="resp_nope", input="x")
        unstored = await client.responses.create(model="m", input="hi", store=False)
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(
                model="m", previous_response_id=unstored.id, input="again"
            )
        await client.close()
        assert same_record(traj, await chat_episode(gw))
    assert len(rec.prompts) == 3 + 2  # the unknown ids generated nothing


@TRANSPORTS
async def test_streamed_events_parse_in_the_sdk(tokenizer, transport):
    async with started(tokenizer) as (gw, _rec):
        session = gw.open_session("s")
        client = openai_client(gw, session, transport)
        stream = await client.responses.create(
            model="m", input="2+2?", tools=RESPONSES_TOOLS, stream=True
        )
        events = [e async for e in stream]
        kinds = [e.type for e in events]
        assert kinds == [
            "response.created", "response.in_progress",
            "response.output_item.added", "response.content_part.added",
            "response.output_text.delta", "response.output_text.done",
            "response.content_part.done", "response.output_item.done",
            "response.output_item.added", "response.function_call_arguments.delta",
            "response.function_call_arguments.done", "response.output_item.done",
            "response.completed",
        ]  # fmt: skip
        assert [e.sequence_number for e in events] == list(range(len(events)))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        args = "".join(
            e.delta for e in events if e.type == "response.function_call_arguments.delta"
        )
        assert text == "Let me run it." and json.loads(args) == {"code": "print(2+2)"}
        done = events[-1].response
        assert done.status == "completed" and done.usage.output_tokens > 0
        assert [o.type for o in done.output] == ["message", "function_call"]
        # The SDK's own stream helper accumulates the same events into the final response.
        async with client.responses.stream(
            model="m", input="2+2?", tools=RESPONSES_TOOLS
        ) as helper:
            final = await helper.get_final_response()
        assert final.output_text == "Let me run it."
        assert final.output[1].name == "python"
        await client.close()


async def test_sampling_logprobs_and_length_cut(tokenizer):
    async with started(
        tokenizer, reply=lambda p: "word " * 50, max_temperature=0.7, max_tokens_per_turn=40
    ) as (gw, rec):
        session = gw.open_session("s")
        client = openai_client(gw, session)
        r = await client.responses.create(
            model="m", input="q", temperature=1.5, top_p=0.5, max_output_tokens=5,
            include=["message.output_text.logprobs"],
        )  # fmt: skip
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        lps = [lp.logprob for lp in r.output[0].content[0].logprobs]
        traj = session.trajectory(task_id="t", group_id="g", reward=0.0, stop_reason="done")
        assert lps == [lp for lp, m in zip(traj.rollout_logprobs, traj.loss_mask, strict=True) if m]
        assert len(lps) == r.usage.output_tokens == 5
        await client.close()
    p = rec.params[0]
    assert (p.temperature, p.top_p, p.max_tokens) == (0.7, 0.5, 5)


async def test_unsupported_requests_are_400s_naming_the_field(tokenizer):
    async with started(tokenizer) as (gw, rec):
        session = gw.open_session("s")
        client = openai_client(gw, session)
        cases: list[tuple[dict[str, Any], str]] = [
            ({"tools": [{"type": "web_search"}]}, "only function tools"),
            ({"text": {"format": {"type": "json_object"}}}, "text.format"),
            ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input_image"),
            ({"input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
            ({"conversation": "conv_1"}, "previous_response_id"),
            ({"top_logprobs": 2}, "top_logprobs"),
            ({"tool_choice": "required"}, "no tools were given"),
            ({"extra_body": {"seed": 1}}, "unsupported parameter 'seed'"),
        ]
        for extra, match in cases:
            args = {"model": "m", "input": "q", **extra}
            with pytest.raises(openai.BadRequestError, match=match):
                await client.responses.create(**args)
        await client.close()
        assert not rec.prompts and session.metrics["gateway/errors_400"] == len(cases)


async def test_unknown_routes_answer_in_the_clients_format(tokenizer):
    async with started(tokenizer) as (gw, _rec):
        session = gw.open_session("s")
        client = openai_client(gw, session)
        with pytest.raises(openai.NotFoundError) as e:
            await client.embeddings.create(model="m", input="x")
        assert e.value.body["code"] == "unknown_route"
        assert "POST responses" in e.value.body["message"]
        await client.close()
        root = f"http://{gw.host}:{gw.port}"
        async with httpx.AsyncClient() as http:
            bare = await http.post(root + "/v1/responses", json={"input": "x"})
            claude = await http.post(
                root + "/v1/complete", json={}, headers={"anthropic-version": "2023-06-01"}
            )
            gone = await http.post(root + "/sessions/nope/v1/responses", json={"input": "x"})
        assert bare.status_code == 404 and bare.json()["error"]["code"] == "session_not_found"
        assert claude.status_code == 404
        assert claude.json()["type"] == "error"
        assert claude.json()["error"]["type"] == "not_found_error"
        assert gone.status_code == 404 and "unknown session" in gone.json()["error"]["message"]
