"""Throughput of the gateway path (an ``openai``-client agent) vs the native AgentLoop.

The same episodes both ways: a user message, then ``turns`` model turns, each
followed by a "go on" user message. The native path runs them as an Env through
the AgentLoop; the gateway path runs them as ``solve(task, client)`` with the real
``openai.AsyncOpenAI`` client, as AgentRunner gives it (in process: its requests are
handed to the gateway's handler) and over real HTTP on 127.0.0.1 (``gateway_http``).
``openai_client_only`` is the CPU the agent and its client spend per request when
answered at once by a canned transport, without any gateway: the floor of any path
through the ``openai`` client. All talk to the same LLM:

* scripted: the in-process scripted policy, answering after ``--latency-ms`` (a
  stand-in for a server's generation time; 0 measures pure framework overhead);
* vLLM (``--vllm URL``): a real server, e.g. one started by ``make serve-tiny``.

Each regime runs ``--episodes`` episodes with up to ``--concurrency`` in flight (256
sessions held at once by default) and prints episodes/s, model turns/s and model
tokens/s of each path and their ratios (target: gateway/native ≥ 0.9), plus the
most sessions the gateway held. (The native AgentLoop ends an episode at a turn cut
by ``max_tokens``, an agent may go on, so on a model that rarely stops, such as the
untrained tiny one, compare turns/s and tokens/s.)
Run: ``python -m benchmarks.gateway [--episodes 256 --turns 4 --latency-ms 200]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

from agentrl import Env, Message, StepResult
from agentrl.gateway import AgentRunner, Gateway, GatewayLimits
from agentrl.gateway.transport import client_httpx
from agentrl.inference.protocol import Generation, SamplingParams
from agentrl.models.tokenizer import build_tokenizer
from agentrl.rollout import AgentLoop, LoopConfig, RolloutRunner
from agentrl.testing.scripted_server import RandomPolicy, ScriptedLLM
from benchmarks.report import report


class GoOn(Env):
    """Says 'go on' until the episode has had ``turns`` model turns."""

    max_turns = 64

    def __init__(self, turns: int) -> None:
        self.turns, self.t = turns, 0

    async def reset(self, task: Any, *, seed: int | None = None) -> list[Message]:
        return [Message.user(f"Task {task['id']}: keep going.")]

    async def step(self, action: Any) -> StepResult:
        self.t += 1
        done = self.t >= self.turns
        return StepResult(observation=[Message.user("go on")], reward=float(done), terminated=done)


class _Canned:
    """An httpx transport that answers every chat request with the same completion."""

    def __init__(self) -> None:
        httpx = client_httpx()
        body = {
            "id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": "fine words here"}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
        }  # fmt: skip
        raw = json.dumps(body).encode()

        class T(httpx.AsyncBaseTransport):  # type: ignore[name-defined]
            async def handle_async_request(self, request: Any) -> Any:
                await request.aread()
                return httpx.Response(
                    200, headers=[(b"content-type", b"application/json")], content=raw,
                    request=request,
                )  # fmt: skip

        self.transport = T()


async def _client_only(episodes: int, turns: int) -> dict[str, float]:
    """The agent and its ``openai`` client alone, answered at once without a gateway: the
    floor of any path through the ``openai`` client (CPU per request)."""
    import openai

    solve = go_on_agent(turns)
    c0 = time.process_time()
    for i in range(episodes):
        http = openai.DefaultAsyncHttpxClient(transport=_Canned().transport)
        async with openai.AsyncOpenAI(
            base_url="http://canned/v1", api_key="-", max_retries=0, http_client=http
        ) as client:
            await solve({"id": i}, client)
    return {"cpu_ms_per_turn": 1e3 * (time.process_time() - c0) / (episodes * turns)}


def go_on_agent(turns: int) -> Any:
    """The same episode as :class:`GoOn`, written as an openai-client agent."""

    async def solve(task: dict[str, Any], client: Any) -> float:
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": f"Task {task['id']}: keep going."}
        ]
        for _ in range(turns):
            r = await client.chat.completions.create(model="policy", messages=messages)
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
            messages.append({"role": "user", "content": "go on"})
        return 1.0

    return solve


class Delayed:
    """An LLMClient that answers after ``latency_s`` (a server's generation time)."""

    def __init__(self, inner: Any, latency_s: float) -> None:
        self.inner, self.latency_s = inner, latency_s

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        return await self.inner.generate(prompt_ids, params, session_id=session_id)


def _loop_config(turns: int) -> LoopConfig:
    """The budgets of both paths (the gateway's limits are the same LoopConfig)."""
    return LoopConfig(max_turns=turns + 1, max_total_tokens=8192, max_tokens_per_turn=64)


async def _native(llm: Any, tok: Any, episodes: int, turns: int, conc: int) -> dict[str, float]:
    cfg = _loop_config(turns)
    runner = RolloutRunner(AgentLoop(llm, tok, cfg), lambda: GoOn(turns), max_concurrency=conc)
    t0, c0 = time.perf_counter(), time.process_time()
    res = await runner.run([{"id": i} for i in range(episodes)])
    return _stats(res.trajectories, time.perf_counter() - t0, time.process_time() - c0)


def _stats(trajs: Sequence[Any], wall: float, cpu: float) -> dict[str, Any]:
    turns = sum(t.num_turns for t in trajs)
    tokens = sum(t.num_model_tokens for t in trajs)
    stops: dict[str, int] = {}
    for t in trajs:
        stops[str(t.stop_reason)] = stops.get(str(t.stop_reason), 0) + 1
    return {
        "wall_s": wall,
        "episodes_per_s": len(trajs) / wall,
        "turns_per_s": turns / wall,
        "model_tokens_per_s": tokens / wall,
        "turns": turns,
        "cpu_ms_per_turn": 1e3 * cpu / max(turns, 1),
        "stop_reasons": stops,
    }


async def _gateway(
    llm: Any, tok: Any, episodes: int, turns: int, conc: int, transport: str = "in_process"
) -> dict[str, float]:
    limits = GatewayLimits(loop=_loop_config(turns))
    async with Gateway(llm, tok, limits) as gw:
        runner = AgentRunner(gw, go_on_agent(turns), max_concurrency=conc, transport=transport)
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, len(gw.sessions))
                await asyncio.sleep(0.01)

        w = asyncio.create_task(watch())
        t0, c0 = time.perf_counter(), time.process_time()
        res = await runner.run([{"id": i} for i in range(episodes)])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        w.cancel()
    trajs = res.trajectories
    segments = sum(t.metrics.get("gateway/segments", 0.0) for t in trajs)
    out = _stats(trajs, wall, cpu)
    out.update(peak_sessions=peak, segments_per_episode=segments / max(len(trajs), 1))
    return out


async def _compare(name: str, llm: Any, tok: Any, a: argparse.Namespace) -> dict[str, Any]:
    native = await _native(llm, tok, a.episodes, a.turns, a.concurrency)
    gateway = await _gateway(llm, tok, a.episodes, a.turns, a.concurrency)
    http = await _gateway(llm, tok, a.episodes, a.turns, a.concurrency, transport="http")
    floor = await _client_only(min(a.episodes, 64), a.turns)
    out = {
        "regime": name,
        "episodes": a.episodes,
        "turns": a.turns,
        "concurrency": a.concurrency,
        "native": native,
        "gateway": gateway,
        "ratio_gateway_over_native": gateway["episodes_per_s"] / native["episodes_per_s"],
        "ratio_turns_per_s": gateway["turns_per_s"] / native["turns_per_s"],
        "ratio_model_tokens_per_s": gateway["model_tokens_per_s"] / native["model_tokens_per_s"],
        "gateway_http": http,
        "ratio_http_over_native": http["episodes_per_s"] / native["episodes_per_s"],
        "ratio_http_turns_per_s": http["turns_per_s"] / native["turns_per_s"],
        # CPU of the agent's openai client alone per request, vs all of a native turn.
        "openai_client_only": floor,
    }
    print(json.dumps(out), flush=True)
    key = name.replace("scripted latency ", "scripted_").replace(" ", "").lower()
    nat = native["turns_per_s"]
    report(f"{key}_gateway_over_native_turns", out["ratio_turns_per_s"], target=0.9, unit="x",
           baseline=nat)  # fmt: skip
    report(f"{key}_http_over_native_turns", out["ratio_http_turns_per_s"], target=0.9, unit="x",
           baseline=nat)  # fmt: skip
    held = min(a.concurrency, a.episodes)  # issue #12: 256 sessions held at the defaults
    report(f"{key}_peak_sessions", gateway["peak_sessions"], target=held, unit="sessions")
    return out


async def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument(
        "--latency-ms", type=float, nargs="*", default=[0.0, 200.0, 1000.0],
        help="Scripted generation latencies to measure (0: pure overhead).",
    )  # fmt: skip
    p.add_argument(
        "--vllm", default=None,
        help="Also measure against this vLLM server URL ('tiny': start one serving the "
        "untrained tiny model).",
    )  # fmt: skip
    p.add_argument("--model", default=None, help="Tokenizer directory of the --vllm model.")
    p.add_argument("--vllm-episodes", type=int, default=64, help="Episodes of the vLLM regime.")
    p.add_argument(
        "--vllm-turns", type=int, default=1,
        help="Turns of the vLLM regime's episodes (the untrained tiny model rarely stops, "
        "and the AgentLoop ends an episode at a turn cut by max_tokens: 1 does the same "
        "work both ways).",
    )  # fmt: skip
    a = p.parse_args(argv)
    tok = build_tokenizer(seed=0)
    results = []
    for ms in a.latency_ms:
        llm = Delayed(ScriptedLLM(RandomPolicy(3000, tok.eos_token_id, 4, 16)), ms / 1000)
        results.append(await _compare(f"scripted latency {ms:g} ms", llm, tok, a))
    if a.vllm:
        results.append(await _vllm(a, tok))
    return results


async def _vllm(a: argparse.Namespace, tok: Any) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from agentrl.inference.client import CompletionsClient

    server = None
    url, model = a.vllm, a.model
    if url == "tiny":  # the untrained tiny model: same architecture and tokenizer, seconds to build
        from agentrl.inference.server import ServerConfig, VLLMServer
        from agentrl.models.tiny import TinyRecipe, ensure_tiny_model

        model = str(ensure_tiny_model(TinyRecipe(steps=0, copy_steps=0, num_demos=0)))
        server = VLLMServer(ServerConfig(model=model, dtype="float32", max_model_len=4096))
        await server.start()
        url = server.url
    try:
        vtok = AutoTokenizer.from_pretrained(model) if model else tok
        async with CompletionsClient(url) as client:
            sub = argparse.Namespace(
                **{**vars(a), "episodes": a.vllm_episodes, "turns": a.vllm_turns}
            )
            return await _compare("vLLM", client, vtok, sub)
    finally:
        if server is not None:
            await server.stop()


if __name__ == "__main__":
    asyncio.run(main())
