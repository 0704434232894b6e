"""Anthropic's Messages API on the gateway, driven by the real ``anthropic`` client (plain,
streamed, and its ``messages.stream`` helper) over HTTP and in process: the same
exact-token record as chat/completions, tool_use / tool_result both ways, Anthropic's stop
reasons, and Anthropic error bodies the client raises."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from agentrl.testing.scripted_server import fake_logprob
from tests.helpers.gateway import (
    ANTHROPIC_TOOLS,
    TOOLS,
    anthropic_client,
    model_tokens,
    openai_client,
    started,
)

TRANSPORTS = pytest.mark.parametrize("transport", ["http", "in_process"])
SYSTEM = "Be brief."


async def chat_episode(gw: Any) -> Any:
    """The tool round trip over chat/completions: the record the Messages API must match."""
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


@TRANSPORTS
async def test_tool_use_round_trip_records_what_chat_completions_records(tokenizer, transport):
    async with started(tokenizer) as (gw, rec):
        session = gw.open_session("messages")
        client = anthropic_client(gw, session, transport)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "2+2?"}]
        m1 = await client.messages.create(
            model="m", max_tokens=100, system=[{"type": "text", "text": SYSTEM}],
            messages=msgs, tools=ANTHROPIC_TOOLS,
        )  # fmt: skip
        assert m1.stop_reason == "tool_use" and [b.type for b in m1.content] == [
            "text", "tool_use",
        ]  # fmt: skip
        text, use = m1.content
        assert text.text == "Let me run it."
        assert use.name == "python" and use.input == {"code": "print(2+2)"}
        msgs += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m1.content]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "4"},
            ]},
        ]  # fmt: skip
        m2 = await client.messages.create(
            model="m", max_tokens=100, system=SYSTEM, messages=msgs, tools=ANTHROPIC_TOOLS
        )
        assert m2.stop_reason == "end_turn" and m2.stop_sequence is None
        assert [b.text for b in m2.content] == ["The answer is \\boxed{4}"]
        assert m2.usage.input_tokens == len(rec.prompts[1])
        await client.close()
        traj = session.trajectory(task_id="t", group_id="g", reward=1.0, stop_reason="done")
        reference = await chat_episode(gw)
    assert traj.metrics["gateway/segments"] == 1.0 and "gateway/rewrites" not in traj.metrics
    assert traj.metrics["gateway/api_messages"] == 2.0
    assert (traj.token_ids, traj.loss_mask, traj.rollout_logprobs, traj.weight_versions) == (
        reference.token_ids, reference.loss_mask, reference.rollout_logprobs,
        reference.weight_versions,
    )  # fmt: skip
    first, second = rec.prompts[:2]
    sampled = model_tokens(traj)[: m1.usage.output_tokens]
    assert second[: len(first) + len(sampled)] == first + sampled
    model = [i for i, m in enumerate(traj.loss_mask) if m]
    assert [traj.rollout_logprobs[i] for i in model] == [
        fake_logprob(traj.token_ids[i], i) for i in model
    ]
    # A scorer reads the conversation as OpenAI dicts, whichever API the agent spoke.
    assert session.conversation[-2]["role"] == "tool"
    assert session.conversation[-1] == {"role": "assistant", "content": m2.content[0].text}


@TRANSPORTS
async def test_streamed_events_parse_in_the_sdk(tokenizer, transport):
    async with started(tokenizer) as (gw, _rec):
        session = gw.open_session("s")
        client = anthropic_client(gw, session, transport)
        args = {
            "model": "m", "max_tokens": 100, "tools": ANTHROPIC_TOOLS,
            "messages": [{"role": "user", "content": "2+2?"}],
        }  # fmt: skip
        stream = await client.messages.create(**args, stream=True)
        events = [e async for e in stream]
        assert [e.type for e in events] == [
            "message_start",
            "content_block_start", "content_block_delta", "content_block_stop",
            "content_block_start", "content_block_delta", "content_block_stop",
            "message_delta", "message_stop",
        ]  # fmt: skip
        deltas = [e.delta for e in events if e.type == "content_block_delta"]
        assert deltas[0].type == "text_delta" and deltas[0].text == "Let me run it."
        assert deltas[1].type == "input_json_delta"
        assert events[4].content_block.type == "tool_use"
        assert events[-2].delta.stop_reason == "tool_use" and events[-2].usage.output_tokens > 0
        async with client.messages.stream(**args) as helper:
            final = await helper.get_final_message()
        assert final.stop_reason == "tool_use"
        assert final.content[1].input == {"code": "print(2+2)"}
        assert final.usage.input_tokens == events[0].message.usage.input_tokens
        await client.close()


async def test_stop_reasons_and_sampling(tokenizer):
    async with started(
        tokenizer, reply=lambda p: "Act: ls\nObservation: x " + "word " * 40,
        max_tokens_per_turn=30,
    ) as (gw, rec):  # fmt: skip
        session = gw.open_session("s")
        client = anthropic_client(gw, session)
        msgs = [{"role": "user", "content": "q"}]
        stop = await client.messages.create(
            model="m", max_tokens=50, messages=msgs, stop_sequences=["Observation:"],
            extra_body={"temperature": 0.3, "top_p": 0.9},  # not in every SDK version
        )  # fmt: skip
        assert stop.stop_reason == "stop_sequence" and stop.stop_sequence == "Observation:"
        assert stop.content[0].text == "Act: ls\n"
        cut = await client.messages.create(model="m", max_tokens=4, messages=msgs)
        assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 4
        await client.close()
    p = rec.params[0]
    assert (p.temperature, p.top_p, p.max_tokens) == (0.3, 0.9, 30)  # clamped to the run's


async def test_errors_are_anthropic_error_bodies_the_client_raises(tokenizer):
    async with started(tokenizer) as (gw, rec):
        session = gw.open_session("s")
        client = anthropic_client(gw, session)
        msgs = [{"role": "user", "content": "q"}]
        cases: list[tuple[dict[str, Any], str]] = [
            ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
             "'image' are not supported"),
            ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
             "only client tools"),
            ({"extra_body": {"top_k": 5}}, "top_k"),
            ({"tool_choice": {"type": "any"}}, "no tools were given"),
            ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": ANTHROPIC_TOOLS},
             "not among the tools"),
            ({"messages": [{"role": "system", "content": "x"}]}, "system goes in 'system'"),
            ({"messages": [*msgs, {"role": "assistant", "content": "The answer is ("}]},
             "prefilled reply"),
            ({"output_config": {"format": {"type": "json_schema", "schema": {}}}},
             "structured output"),
        ]  # fmt: skip
        for extra, match in cases:
            args = {"model": "m", "max_tokens": 10, "messages": msgs, **extra}
            with pytest.raises(anthropic.BadRequestError, match=match) as e:
                await client.messages.create(**args)
            assert e.value.body["type"] == "error"
            assert e.value.body["error"]["type"] == "invalid_request_error"
        gw.close_session(session)
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.create(model="m", max_tokens=10, messages=msgs)
        await client.close()
        async with httpx.AsyncClient() as http:
            bad = await http.post(gw.anthropic_base_url(session) + "/v1/messages", content=b"{")
        assert bad.status_code == 404 and bad.json()["error"]["type"] == "not_found_error"
        assert not rec.prompts
