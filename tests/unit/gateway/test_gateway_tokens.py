"""Session tokens: random, found in constant time, never answered for a near miss, never logged."""

from __future__ import annotations

import logging
import string
from typing import Any

import httpx
import openai
import pytest

from agentrl.gateway.server import Gateway, redact_token
from agentrl.gateway.session import GatewayLimits
from agentrl.rollout import LoopConfig
from agentrl.testing.scripted_server import TextPolicy
from tests.helpers.gateway import Recording

URL_SAFE = set(string.ascii_letters + string.digits + "-_")


def _near_miss(token: str) -> str:
    return token[:-1] + ("A" if token[-1] != "A" else "B")


async def test_tokens_are_long_random_and_only_their_own_session_answers(tokenizer: Any) -> None:
    rec = Recording(TextPolicy(tokenizer, lambda prompt: "hello"))
    async with Gateway(rec, tokenizer, GatewayLimits(loop=LoopConfig())) as gw:
        a, b = gw.open_session("ep-a"), gw.open_session("ep-b")
        assert a.token != b.token
        assert len(a.token) >= 43 and set(a.token) <= URL_SAFE
        body = {"model": "m", "messages": [{"role": "user", "content": "a's secret question"}]}
        root = f"http://{gw.host}:{gw.port}/sessions"
        async with httpx.AsyncClient(timeout=30) as http:
            ok = await http.post(f"{root}/{a.token}/v1/chat/completions", json=body)
            assert ok.status_code == 200 and len(a.conversation) == 2
            for wrong in (_near_miss(a.token), a.token[:-1], a.token + "x", a.token.upper(), ""):
                for route in ("chat/completions", "models"):
                    method = "POST" if route != "models" else "GET"
                    r = await http.request(method, f"{root}/{wrong}/v1/{route}", json=body)
                    assert r.status_code == 404, (wrong, route, r.text)
                    assert a.token not in r.text and b.token not in r.text
                    assert "secret question" not in r.text
            assert len(a.conversation) == 2 and not b.conversation  # nothing reached them
            gw.close_session(a)
            r = await http.post(f"{root}/{a.token}/v1/chat/completions", json=body)
            assert r.status_code == 404 and a.token not in r.text
        gw.close_session(b)
        assert not gw.sessions


async def test_a_session_life_logs_no_token(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rec = Recording(TextPolicy(tokenizer, lambda prompt: "hello"))
    async with Gateway(rec, tokenizer, GatewayLimits(loop=LoopConfig())) as gw:
        s = gw.open_session("ep-0")
        base = gw.base_url(s)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient(timeout=30) as http:
            assert (await http.post(f"{base}/chat/completions", json=body)).status_code == 200
            assert (await http.post(f"{base}/chat/completions", content=b"{")).status_code == 400
            unknown = await http.post(f"{base}/embeddings", json={})
            assert unknown.status_code == 404 and s.token not in unknown.text
            assert (await http.get(f"{base}/models")).status_code == 200
        client = openai.AsyncOpenAI(base_url=base, api_key="-", max_retries=0)
        reply = await client.chat.completions.create(model="m", messages=body["messages"])
        assert reply.choices[0].message.content == "hello"
        await client.close()
        gw.close_session(s)
    assert caplog.records  # the capture saw the run's logs
    assert s.token not in caplog.text
    assert redact_token(base) == f"http://{gw.host}:{gw.port}/sessions/{{token}}/v1"
