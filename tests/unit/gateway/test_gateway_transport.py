"""The in-process transport AgentRunner gives agents' clients, against the HTTP server it
stands in for: the same answers, the client's timeout, other routes over real HTTP; and
the HTTP server's sockets answer without Nagle's delay."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import openai
import pytest

from agentrl.gateway import AgentRunner, Gateway, GatewayLimits
from agentrl.gateway.transport import in_process_client
from agentrl.inference.protocol import Generation, SamplingParams
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy
from tests.helpers.gateway import CALL, TOOLS


def _stable(body: Any) -> Any:
    """A body without the fields that differ between any two answers (id, created)."""
    if isinstance(body, dict):
        return {k: _stable(v) for k, v in body.items() if k not in ("id", "created")}
    if isinstance(body, list):
        return [_stable(v) for v in body]
    return body


def _sse(text: str) -> list[Any]:
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    return [e if e == "[DONE]" else _stable(json.loads(e)) for e in events]


async def test_in_process_answers_are_the_servers_bytes(tokenizer):
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda p: "Let me run it.\n" + CALL))
    async with Gateway(llm, tokenizer) as gw:
        bodies: dict[str, list[Any]] = {}
        for transport in ("http", "in_process"):
            s = gw.open_session(transport)
            http = (
                in_process_client(gw)
                if transport == "in_process"
                else openai.DefaultAsyncHttpxClient()
            )
            async with http:
                url = gw.base_url(s)
                msgs = [{"role": "user", "content": "2+2?"}]
                req = {"model": "m", "messages": msgs, "tools": TOOLS, "logprobs": True}
                plain = await http.post(url + "/chat/completions", json=req)
                stream = await http.post(url + "/chat/completions", json={**req, "stream": True})
                bad = await http.post(url + "/chat/completions", json={**req, "n": 3})
                models = await http.get(url + "/models")
                gone = await http.post(url.replace(s.token, "x") + "/chat/completions", json=req)
            assert stream.headers["content-type"].startswith("text/event-stream")
            bodies[transport] = [
                (plain.status_code, _stable(plain.json())),
                (stream.status_code, _sse(stream.text)),
                (bad.status_code, bad.json()),
                (models.status_code, models.json()),
                (gone.status_code, gone.json()),
            ]
    assert [b[0] for b in bodies["http"]] == [200, 200, 400, 200, 404]
    assert bodies["in_process"] == bodies["http"]
    assert bodies["http"][0][1]["choices"][0]["finish_reason"] == "tool_calls"


class Hang:
    """An LLMClient whose generations never come."""

    async def generate(
        self, prompt_ids: Any, params: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


async def test_the_clients_timeout_holds_in_process(tokenizer):
    async with Gateway(Hang(), tokenizer) as gw:
        s = gw.open_session("slow")
        client = openai.AsyncOpenAI(
            base_url=gw.base_url(s), api_key="-", max_retries=0, timeout=0.3,
            http_client=in_process_client(gw),
        )  # fmt: skip
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "q"}]
            )
        await client.close()
        assert not s._inflight  # the generation was cancelled with the request


async def test_unknown_routes_answer_alike_and_other_paths_go_to_the_http_server(tokenizer):
    async with Gateway(ScriptedLLM(TextPolicy(tokenizer, lambda p: "ok")), tokenizer) as gw:
        s = gw.open_session("e")
        answers = []
        for http in (in_process_client(gw), openai.DefaultAsyncHttpxClient()):
            async with http:
                r = await http.post(gw.base_url(s) + "/embeddings", json={"input": "x"})
                answers.append((r.status_code, r.json()))
        # A path outside the sessions goes to the server, from the in-process client too.
        async with in_process_client(gw) as http:
            health = await http.get(f"http://{gw.host}:{gw.port}/health")
            bare = await http.post(f"http://{gw.host}:{gw.port}/v1/embeddings", json={})
        assert answers[0] == answers[1]
        status, body = answers[0]
        assert status == 404 and body["error"]["code"] == "unknown_route"
        assert "POST responses" in body["error"]["message"]
        assert bare.status_code == 404 and "POST messages" in bare.json()["error"]["message"]
        assert health.json() == {"status": "ok", "sessions": 1}


async def test_runner_transports_record_the_same_tokens(tokenizer):
    async def solve(task: dict[str, Any], client: Any) -> float:
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "2+2?"}]
        r = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        call = r.choices[0].message.tool_calls[0]
        msgs += [
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "4"},
        ]
        r = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        return float("4" in (r.choices[0].message.content or ""))

    def reply(prompt: str) -> str:
        last = prompt.rsplit("<|im_start|>user", 1)[-1]
        return "It is \\boxed{4}" if "<tool_response>" in last else "Let me run it.\n" + CALL

    trajs = {}
    for transport in ("http", "in_process"):
        llm = ScriptedLLM(TextPolicy(tokenizer, reply))
        async with Gateway(llm, tokenizer, GatewayLimits()) as gw:
            runner = AgentRunner(gw, solve, transport=transport)
            trajs[transport] = await runner.run_episode({"id": 0})
    a, b = trajs["http"], trajs["in_process"]
    assert a.reward == b.reward == 1.0 and a.num_turns == b.num_turns == 2
    assert (a.token_ids, a.loss_mask, a.rollout_logprobs) == (
        b.token_ids, b.loss_mask, b.rollout_logprobs,
    )  # fmt: skip
    with pytest.raises(ValueError, match="transport"):
        AgentRunner(gw, solve, transport="carrier-pigeon")


async def test_server_connections_send_without_nagles_delay(tokenizer):
    # Without TCP_NODELAY on the accepted sockets, a response written in two pieces waits
    # for the client's delayed ACK (~40 ms per request on Linux).
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda p: "ok"))
    async with Gateway(llm, tokenizer) as gw, openai.DefaultAsyncHttpxClient() as http:
        await http.get(f"http://{gw.host}:{gw.port}/health")  # keeps its connection open
        conns = list(gw._server.server_state.connections)
        assert conns
        for c in conns:
            sock = c.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
