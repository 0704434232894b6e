"""CompletionsClient / GenerateClient against a real local HTTP server faking vLLM's API."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from agentrl.inference.client import (
    BadRequest,
    CompletionsClient,
    GenerateClient,
    ServerUnavailable,
    make_client,
)
from agentrl.inference.protocol import LLMClient, LLMError, SamplingParams
from tests.helpers.http_fakes import Seen, fake_server, reply


def completions_body(ids, lps, reason="stop", with_ids=True):
    choice = {
        "index": 0,
        "text": "",
        "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": lps},
        "finish_reason": reason,
        "stop_reason": None,
    }
    if with_ids:
        choice["token_ids"] = ids
    return {"choices": [choice]}


@asynccontextmanager
async def served(
    handler: Callable[[Seen, int], Any], cls: type[CompletionsClient] = CompletionsClient, **kw: Any
) -> AsyncIterator[tuple[CompletionsClient, list[Seen]]]:
    """A client of ``cls`` connected to a fake server answering with ``handler``."""
    async with fake_server(handler) as (url, seen), cls(url, **kw) as client:
        yield client, seen


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_sends_documented_fields_and_reads_tokens():
    async with served(
        lambda r, n: reply(200, completions_body([5, 2], [-0.5, -0.1])), model="m"
    ) as (c, seen):
        assert isinstance(c, LLMClient)
        params = SamplingParams(
            max_tokens=7, temperature=0.5, top_p=0.9, top_k=4, stop_token_ids=(2,), seed=3
        )
        g = await c.generate([1, 2, 3], params, session_id="e1")
    assert seen[0].path == "/v1/completions"
    assert seen[0].body == {
        "prompt": [1, 2, 3], "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 4,
        "stop_token_ids": [2], "logprobs": 0, "return_tokens_as_token_ids": True,
        "return_token_ids": True, "skip_special_tokens": False, "n": 1, "stream": False,
        "seed": 3, "model": "m",
    }  # fmt: skip
    assert g.token_ids == [5, 2] and g.logprobs == [-0.5, -0.1]
    assert g.finish_reason == "stop" and g.weight_versions == [0, 0] and g.server == c.base_url


async def test_parses_token_id_strings_when_token_ids_absent():
    body = completions_body([17, 4, 99], [-1.0, -2.0, -3.0], reason="length", with_ids=False)
    async with served(lambda r, n: reply(200, body)) as (c, _):
        g = await c.generate([1], SamplingParams())
    assert g.token_ids == [17, 4, 99] and g.finish_reason == "length"


async def test_weight_version_is_the_older_one_when_it_changes_mid_request():
    version = iter([3, 4])
    async with served(
        lambda r, n: reply(200, completions_body([5], [-0.5])), weight_version=lambda: next(version)
    ) as (c, _):
        g = await c.generate([1], SamplingParams())
    assert g.weight_versions == [3]


async def test_length_mismatch_is_an_error():
    body = completions_body([5, 6], [-0.5])
    async with served(lambda r, n: reply(200, body)) as (c, _):
        with pytest.raises(LLMError, match="2 tokens but 1 logprobs"):
            await c.generate([1], SamplingParams())


async def test_non_json_body_is_an_error():
    async with served(lambda r, n: reply(200, "<html>")) as (c, _):
        with pytest.raises(LLMError, match="not JSON"):
            await c.generate([1], SamplingParams())


async def test_bad_request_is_not_retried():
    err = {"error": {"message": "too long"}}
    async with served(lambda r, n: reply(400, err), retries=3) as (c, seen):
        with pytest.raises(BadRequest, match="too long"):
            await c.generate([1], SamplingParams())
    assert len(seen) == 1


async def test_empty_prompt_is_rejected_locally():
    async with served(lambda r, n: reply(200, {})) as (c, seen):
        with pytest.raises(BadRequest, match="empty prompt"):
            await c.generate([], SamplingParams())
    assert seen == []


async def test_503_then_success_is_retried():
    def handler(r, n):
        if n == 1:
            return reply(503, "warming up")
        return reply(200, completions_body([5], [-0.5]))

    async with served(handler, retries=2) as (c, seen):
        g = await c.generate([1], SamplingParams())
    assert g.token_ids == [5] and len(seen) == 2


async def test_500_is_not_retried():
    async with served(lambda r, n: reply(500, "boom"), retries=3) as (c, seen):
        with pytest.raises(ServerUnavailable, match="HTTP 500: boom"):
            await c.generate([1], SamplingParams())
    assert len(seen) == 1


async def test_connect_errors_are_retried_then_reported():
    url = f"http://127.0.0.1:{closed_port()}"
    async with CompletionsClient(url, retries=2) as c:
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(ServerUnavailable, match="cannot connect"):
            await c.generate([1], SamplingParams())
        # two backoffs (0.2 s + 0.4 s): three attempts were made
        assert asyncio.get_running_loop().time() - t0 >= 0.6


async def test_read_timeout_is_not_retried():
    async def slow(r, n):
        await asyncio.sleep(2)
        return reply(200, completions_body([5], [-0.5]))

    async with served(slow, retries=3, timeout_s=0.3) as (c, seen):
        with pytest.raises(ServerUnavailable, match=r"no response within 0\.3 s"):
            await c.generate([1], SamplingParams())
    assert len(seen) == 1


async def test_dropped_connection_is_not_retried():
    async with served(lambda r, n: "drop", retries=3) as (c, seen):
        with pytest.raises(ServerUnavailable, match="request failed"):
            await c.generate([1], SamplingParams())
    assert len(seen) == 1


async def test_per_call_timeout_overrides_the_client_default():
    async def slow(r, n):
        await asyncio.sleep(2)
        return reply(200, {})

    async with served(slow, timeout_s=60) as (c, _):
        with pytest.raises(ServerUnavailable, match=r"no response within 0\.3 s"):
            await c.post_json("/pause", {}, timeout_s=0.3)


async def test_many_concurrent_requests_share_one_pool():
    async def answer(r, n):
        await asyncio.sleep(0.01)
        return reply(200, completions_body([r.body["prompt"][0]], [-0.1]))

    async with served(answer, max_connections=8) as (c, seen):
        outs = await asyncio.gather(*(c.generate([i], SamplingParams()) for i in range(1, 65)))
    assert [g.token_ids for g in outs] == [[i] for i in range(1, 65)] and len(seen) == 64


def test_client_works_across_event_loops():
    async def once(c: CompletionsClient) -> list[int]:
        return (await c.generate([1], SamplingParams())).token_ids

    async def main() -> None:
        async with fake_server(lambda r, n: reply(200, completions_body([5], [-0.5]))) as (u, _):
            c = CompletionsClient(u)
            # a second event loop (in a thread) gets its own pool from the same client
            other = await asyncio.to_thread(asyncio.run, once(c))
            assert await once(c) == other == [5]
            await c.close()

    asyncio.run(main())


async def test_close_is_idempotent_and_a_closed_client_refuses():
    async with fake_server(lambda r, n: reply(200, completions_body([5], [-0.5]))) as (url, _):
        c = CompletionsClient(url)
        await c.generate([1], SamplingParams())
        await c.close()
        await c.close()
        with pytest.raises(ServerUnavailable, match="closed"):
            await c.generate([1], SamplingParams())


async def test_generate_client_reads_weight_version_spans():
    body = {
        "choices": [
            {
                "index": 0,
                "token_ids": [7, 8, 9],
                "finish_reason": "length",
                "logprobs": {"content": [{"token_id": t, "logprob": -t / 10} for t in (7, 8, 9)]},
                "weight_versions": [
                    {"version": "1", "start": 0, "end": 2},
                    {"version": "2", "start": 2, "end": 3},
                ],
            }
        ]
    }
    async with served(lambda r, n: reply(200, body), GenerateClient) as (c, seen):
        g = await c.generate([1, 2], SamplingParams(max_tokens=3, seed=1))
    sent = seen[0].body
    assert seen[0].path == "/inference/v1/generate"
    assert sent["token_ids"] == [1, 2] and sent["sampling_params"]["max_tokens"] == 3
    assert sent["sampling_params"]["detokenize"] is False
    assert g.token_ids == [7, 8, 9] and g.logprobs == [-0.7, -0.8, -0.9]
    assert g.weight_versions == [1, 1, 2]


def test_make_client_rejects_unknown_api():
    with pytest.raises(ValueError, match="unknown inference api"):
        make_client("grpc", "http://127.0.0.1:1")


def test_span_versions_realigned_when_vllm_miscounts():
    from agentrl.inference.client import _span_versions

    spans = [{"version": "1", "start": 0, "end": 2}, {"version": "2", "start": 2, "end": 4}]
    assert _span_versions(spans, 4) == [1, 1, 2, 2]
    assert _span_versions(spans, 6) == [1, 1, 1, 1, 2, 2]  # ends early: aligned to the end
    assert _span_versions(spans, 3) == [1, 2, 2]  # ends late
    assert _span_versions([{"version": "default", "start": 0, "end": 4}], 4) is None
