"""CompletionsClient / GenerateClient against an in-process fake of vLLM's HTTP API."""

from __future__ import annotations

import json

import httpx
import pytest

from agentrl.inference.client import (
    BadRequest,
    CompletionsClient,
    GenerateClient,
    ServerUnavailable,
    make_client,
)
from agentrl.llm import LLMClient, LLMError, SamplingParams

URL = "http://fake:8000"


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


def transport(handler):
    seen = []

    def wrapped(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request, len(seen))

    return httpx.MockTransport(wrapped), seen


async def test_sends_documented_fields_and_reads_tokens():
    t, seen = transport(
        lambda r, n: httpx.Response(200, json=completions_body([5, 2], [-0.5, -0.1]))
    )
    async with CompletionsClient(URL, transport=t, model="m") as c:
        assert isinstance(c, LLMClient)
        params = SamplingParams(
            max_tokens=7, temperature=0.5, top_p=0.9, top_k=4, stop_token_ids=(2,), seed=3
        )
        g = await c.generate([1, 2, 3], params, session_id="e1")
    body = json.loads(seen[0].content)
    assert seen[0].url.path == "/v1/completions"
    assert body == {
        "prompt": [1, 2, 3], "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 4,
        "stop_token_ids": [2], "logprobs": 0, "return_tokens_as_token_ids": True,
        "return_token_ids": True, "skip_special_tokens": False, "n": 1, "stream": False,
        "seed": 3, "model": "m",
    }  # fmt: skip
    assert g.token_ids == [5, 2] and g.logprobs == [-0.5, -0.1]
    assert g.finish_reason == "stop" and g.weight_versions == [0, 0] and g.server == URL


async def test_parses_token_id_strings_when_token_ids_absent():
    body = completions_body([17, 4, 99], [-1.0, -2.0, -3.0], reason="length", with_ids=False)
    t, _ = transport(lambda r, n: httpx.Response(200, json=body))
    async with CompletionsClient(URL, transport=t) as c:
        g = await c.generate([1], SamplingParams())
    assert g.token_ids == [17, 4, 99] and g.finish_reason == "length"


async def test_weight_version_is_the_older_one_when_it_changes_mid_request():
    version = iter([3, 4])
    t, _ = transport(lambda r, n: httpx.Response(200, json=completions_body([5], [-0.5])))
    async with CompletionsClient(URL, transport=t, weight_version=lambda: next(version)) as c:
        g = await c.generate([1], SamplingParams())
    assert g.weight_versions == [3]


async def test_length_mismatch_is_an_error():
    body = completions_body([5, 6], [-0.5])
    t, _ = transport(lambda r, n: httpx.Response(200, json=body))
    async with CompletionsClient(URL, transport=t) as c:
        with pytest.raises(LLMError, match="2 tokens but 1 logprobs"):
            await c.generate([1], SamplingParams())


async def test_bad_request_is_not_retried():
    t, seen = transport(lambda r, n: httpx.Response(400, json={"error": {"message": "too long"}}))
    async with CompletionsClient(URL, transport=t, retries=3) as c:
        with pytest.raises(BadRequest, match="too long"):
            await c.generate([1], SamplingParams())
    assert len(seen) == 1


async def test_empty_prompt_is_rejected_locally():
    t, seen = transport(lambda r, n: httpx.Response(200, json={}))
    async with CompletionsClient(URL, transport=t) as c:
        with pytest.raises(BadRequest, match="empty prompt"):
            await c.generate([], SamplingParams())
    assert seen == []


async def test_503_then_success_is_retried():
    def handler(r, n):
        if n == 1:
            return httpx.Response(503, text="warming up")
        return httpx.Response(200, json=completions_body([5], [-0.5]))

    t, seen = transport(handler)
    async with CompletionsClient(URL, transport=t, retries=2) as c:
        g = await c.generate([1], SamplingParams())
    assert g.token_ids == [5] and len(seen) == 2


async def test_connect_errors_are_retried_then_reported():
    def handler(r, n):
        raise httpx.ConnectError("refused", request=r)

    t, seen = transport(handler)
    async with CompletionsClient(URL, transport=t, retries=2) as c:
        with pytest.raises(ServerUnavailable, match="cannot connect"):
            await c.generate([1], SamplingParams())
    assert len(seen) == 3


async def test_read_timeout_is_not_retried():
    def handler(r, n):
        raise httpx.ReadTimeout("slow", request=r)

    t, seen = transport(handler)
    async with CompletionsClient(URL, transport=t, retries=3) as c:
        with pytest.raises(ServerUnavailable, match="request failed"):
            await c.generate([1], SamplingParams())
    assert len(seen) == 1


async def test_close_is_idempotent():
    c = CompletionsClient(URL)
    await c.close()
    await c.close()


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
    t, seen = transport(lambda r, n: httpx.Response(200, json=body))
    async with GenerateClient(URL, transport=t) as c:
        g = await c.generate([1, 2], SamplingParams(max_tokens=3, seed=1))
    sent = json.loads(seen[0].content)
    assert seen[0].url.path == "/inference/v1/generate"
    assert sent["token_ids"] == [1, 2] and sent["sampling_params"]["max_tokens"] == 3
    assert sent["sampling_params"]["detokenize"] is False
    assert g.token_ids == [7, 8, 9] and g.logprobs == [-0.7, -0.8, -0.9]
    assert g.weight_versions == [1, 1, 2]


def test_make_client_rejects_unknown_api():
    with pytest.raises(ValueError, match="unknown inference api"):
        make_client("grpc", URL)


def test_span_versions_realigned_when_vllm_miscounts():
    from agentrl.inference.client import _span_versions

    spans = [{"version": "1", "start": 0, "end": 2}, {"version": "2", "start": 2, "end": 4}]
    assert _span_versions(spans, 4) == [1, 1, 2, 2]
    assert _span_versions(spans, 6) == [1, 1, 1, 1, 2, 2]  # ends early: aligned to the end
    assert _span_versions(spans, 3) == [1, 2, 2]  # ends late
    assert _span_versions([{"version": "default", "start": 0, "end": 4}], 4) is None
