"""The gateway at scale: 1,000 concurrent agent sessions from real ``openai`` clients.

Three processes, so each one's CPU and memory are its own:

* the scripted server (``agentrl.testing.scripted_server``, vLLM's ``/v1/completions``
  subset over HTTP; seeded random replies of 4-16 tokens, answered at once);
* the gateway (:class:`agentrl.gateway.Gateway`, its backend a ``CompletionsClient`` to
  the scripted server), in a subprocess this module starts with ``--serve-gateway``;
* this process: ``--sessions`` agents, each its own ``openai.AsyncOpenAI`` client on its
  session's base URL, all started at once, each ``--turns`` chat completions in a row.

Then the same requests direct to the backend, in the same run: each session's recorded
prompts (the exact token ids the gateway sent) replayed with the same sampling
parameters by the same ``openai`` clients (``completions.create`` with token-id
prompts), as many sessions at once. Per-request latency is timed around the client's
call on both paths; the ratios gateway/direct at p50 and p99 are the gateway's cost
under this load (its CPU per request is printed too).

Also: sessions lost (a session whose trajectory is missing, has not ``--turns`` turns in
one segment, or ended with an error; target 0), client errors (target 0), the gateway
process's RSS per held session ((RSS with every session held - RSS after a warm-up
wave) / sessions), and what a second wave of as many sessions adds after the first
closed (its sessions' memory must be reused: ≤ ``REGROWTH_LIMIT_KIB`` per session).

Run: ``python -m benchmarks.scale_gateway [--sessions 1000 --turns 4] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.rollout import LoopConfig
from benchmarks.local_http import start_http
from benchmarks.report import report
from benchmarks.stats import cpu_seconds, percentile, rss_bytes

CTL = "CTL "  # prefix of the gateway subprocess's control replies on its stdout
CTL_LINE_LIMIT = 2**26  # bytes of one control line (``open`` answers with every session URL)
WARMUP_SESSIONS = 32
REQUEST_TIMEOUT_S = 120.0
# KiB of gateway RSS per session a second wave may add after the first closed: a tenth of
# what a held session takes (~50 KiB), so a closed session's record kept by mistake shows.
REGROWTH_LIMIT_KIB = 5.0


def loop_config(turns: int) -> LoopConfig:
    """The run's budgets: room for every turn (the budget never cuts a reply)."""
    return LoopConfig(max_turns=turns + 1, max_total_tokens=8192, max_tokens_per_turn=64)


# --------------------------------------------------------------------- the gateway process


class _LastParams:
    """The backend client, keeping the last request's sampling parameters (the direct
    replay sends the same; nothing is kept per session, so RSS stays the gateway's)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.params: Any = None

    async def generate(self, prompt_ids: Any, params: Any, *, session_id: str | None = None) -> Any:
        self.params = params
        return await self.inner.generate(prompt_ids, params, session_id=session_id)


def _send(obj: Any) -> None:
    print(CTL + json.dumps(obj), flush=True)


def _session_record(session: Any) -> dict[str, Any]:
    t = session.trajectory(task_id="t", group_id="g", reward=0.0, stop_reason=session.stop_reason)
    model = [s for s in t.spans if s.kind == "model"]
    return {
        "turns": t.num_turns,
        "segments": t.metrics.get("gateway/segments", 0.0),
        "stop_reason": None if session.stop_reason is None else str(session.stop_reason),
        "error": session.error or session.last_api_error,
        "prompts": [t.token_ids[: s.start] for s in model],
        "longest_turn": max((s.end - s.start for s in model), default=0),
    }


async def serve_gateway(backend: str, turns: int) -> None:
    """The gateway subprocess: answers ``open N``, ``check PATH`` and ``close`` on stdin,
    one ``CTL {json}`` line each; ends at EOF."""
    from agentrl.gateway import Gateway, GatewayLimits
    from agentrl.inference.client import CompletionsClient
    from agentrl.models.tokenizer import build_tokenizer

    tok = build_tokenizer(seed=0)
    loop = asyncio.get_running_loop()
    async with CompletionsClient(backend, timeout_s=REQUEST_TIMEOUT_S) as client:
        llm = _LastParams(client)
        async with Gateway(llm, tok, GatewayLimits(loop=loop_config(turns))) as gw:
            opened: list[Any] = []
            n = 0
            _send({"port": gw.port})
            while line := await loop.run_in_executor(None, sys.stdin.readline):
                cmd, _, arg = line.strip().partition(" ")
                if cmd == "open":
                    new = [gw.open_session(f"s{n + i}") for i in range(int(arg))]
                    n += len(new)
                    opened += new
                    _send({"urls": [gw.base_url(s) for s in new]})
                elif cmd == "check":
                    p = llm.params
                    params = None if p is None else {
                        "max_tokens": p.max_tokens, "temperature": p.temperature,
                        "top_p": p.top_p, "top_k": p.top_k, "seed": p.seed,
                        "stop_token_ids": list(p.stop_token_ids),
                    }  # fmt: skip
                    sessions = [_session_record(s) for s in opened]
                    record = json.dumps({"params": params, "sessions": sessions})
                    await asyncio.to_thread(Path(arg).write_text, record)
                    _send({"written": arg})
                elif cmd == "close":
                    for s in opened:
                        gw.close_session(s)
                    opened.clear()
                    gc.collect()
                    _send({"open_sessions": len(gw.sessions)})
                else:
                    _send({"error": f"unknown command {cmd!r}"})


class _Gateway:
    """This side of the gateway subprocess: its pid and its control commands."""

    def __init__(self, proc: asyncio.subprocess.Process, timeout_s: float) -> None:
        self.proc, self.timeout_s = proc, timeout_s

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        async with asyncio.timeout(self.timeout_s):
            while line := (await self.proc.stdout.readline()).decode():
                if line.startswith(CTL):
                    return dict(json.loads(line[len(CTL) :]))
        raise RuntimeError(f"the gateway process ended (exit {await self.proc.wait()})")

    async def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        await self.proc.stdin.drain()
        return await self.read()


# --------------------------------------------------------------------- the agents


@dataclass
class Wave:
    """One wave of sessions: per-request latencies, errors and the peak in flight."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    inflight: int = 0
    peak_inflight: int = 0
    wall_s: float = 0.0

    async def timed(self, call: Any) -> Any:
        """Awaits ``call``, recording its latency, or its error (then returns None)."""
        import openai

        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)
        t0 = time.perf_counter()
        try:
            out = await call
        except openai.OpenAIError as e:
            self.errors[type(e).__name__] += 1
            return None
        finally:
            self.inflight -= 1
        self.latencies.append(time.perf_counter() - t0)
        return out

    def summary(self) -> dict[str, Any]:
        ms = [1e3 * x for x in self.latencies]
        return {
            "requests": len(ms),
            "p50_ms": percentile(ms, 50),
            "p99_ms": percentile(ms, 99),
            "max_ms": max(ms, default=float("nan")),
            "errors": dict(self.errors),
            "peak_inflight": self.peak_inflight,
            "wall_s": self.wall_s,
            "requests_per_s": len(ms) / self.wall_s if self.wall_s else float("nan"),
        }


def _client(base_url: str) -> Any:
    import openai

    # Plain HTTP, no TLS context (as AgentRunner's http transport); no retries: an error
    # is counted, not hidden; a finite timeout on every request.
    return openai.AsyncOpenAI(
        base_url=base_url, api_key="agentrl", max_retries=0, timeout=REQUEST_TIMEOUT_S,
        http_client=openai.DefaultAsyncHttpxClient(verify=False),
    )  # fmt: skip


async def _chat_agent(client: Any, i: int, turns: int, wave: Wave) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Task {i}: keep going."}]
    async with client:
        for _ in range(turns):
            call = client.chat.completions.create(model="policy", messages=messages)
            r = await wave.timed(call)
            if r is None:
                return
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
            messages.append({"role": "user", "content": "go on"})


async def _direct_agent(
    client: Any, prompts: list[list[int]], params: dict[str, Any], wave: Wave
) -> None:
    extra = {
        "top_k": params["top_k"], "stop_token_ids": params["stop_token_ids"],
        "return_tokens_as_token_ids": True, "return_token_ids": True,
        "skip_special_tokens": False,
    }  # fmt: skip
    seed = {} if params["seed"] is None else {"seed": params["seed"]}
    async with client:
        for prompt in prompts:
            call = client.completions.create(
                model="scripted", prompt=prompt, max_tokens=params["max_tokens"],
                temperature=params["temperature"], top_p=params["top_p"], logprobs=0,
                extra_body=extra, **seed,
            )  # fmt: skip
            if await wave.timed(call) is None:
                return


async def _run_wave(agents: list[Any], timeout_s: float, wave: Wave) -> Wave:
    t0 = time.perf_counter()
    async with asyncio.timeout(timeout_s):
        await asyncio.gather(*agents)
    wave.wall_s = time.perf_counter() - t0
    return wave


async def chat_wave(urls: list[str], turns: int, timeout_s: float) -> Wave:
    """Every session's agent at once (clients made first, so they start together)."""
    wave = Wave()
    clients = [_client(u) for u in urls]
    agents = [_chat_agent(c, i, turns, wave) for i, c in enumerate(clients)]
    return await _run_wave(agents, timeout_s, wave)


async def direct_wave(
    backend: str, sessions: list[dict[str, Any]], params: dict[str, Any], timeout_s: float
) -> Wave:
    """Each session's recorded requests, replayed straight to the backend, all at once."""
    wave = Wave()
    clients = [_client(backend + "/v1") for _ in sessions]
    agents = [
        _direct_agent(c, s["prompts"], params, wave) for c, s in zip(clients, sessions, strict=True)
    ]
    return await _run_wave(agents, timeout_s, wave)


# --------------------------------------------------------------------- the run


def lost_sessions(sessions: list[dict[str, Any]], expected: int, turns: int) -> dict[str, int]:
    """Why each of the ``expected`` sessions is lost, counted; empty when none is.

    A session is kept when its trajectory has ``turns`` turns in one segment, and it
    ended with no error and no reason of its own.
    """
    why: Counter[str] = Counter()
    why["missing"] = max(expected - len(sessions), 0)
    for s in sessions:
        if s["error"] or s["stop_reason"] is not None:
            why[f"ended: {s['stop_reason'] or 'error'}"] += 1
        elif s["turns"] != turns:
            why[f"{s['turns']} turns, not {turns}"] += 1
        elif s["segments"] != 1:
            why[f"{s['segments']:g} segments"] += 1
    return {k: v for k, v in why.items() if v}


async def run(sessions: int, turns: int, timeout_s: float) -> dict[str, Any]:
    """The whole measurement; the subprocesses it starts are gone when it returns."""
    from agentrl.models.tokenizer import build_tokenizer

    tok = build_tokenizer(seed=0)
    vocab, eos = len(tok) - 16, tok.eos_token_id
    backend, url = start_http(
        lambda port: [
            *(sys.executable, "-m", "agentrl.testing.scripted_server", "--port", str(port)),
            *("--vocab", str(vocab), "--eos", str(eos), "--min-len", "4", "--max-len", "16"),
        ]
    )
    proc = None
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.scale_gateway", "--serve-gateway", url,
            "--turns", str(turns), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=CTL_LINE_LIMIT,
        )  # fmt: skip
        gw = _Gateway(proc, timeout_s)
        await gw.read()  # serving
        warm = await gw.ask(f"open {min(WARMUP_SESSIONS, sessions)}")
        await chat_wave(warm["urls"], turns, timeout_s)
        await gw.ask("close")
        rss0 = rss_bytes(gw.pid)
        urls = (await gw.ask(f"open {sessions}"))["urls"]
        cpu0 = cpu_seconds(gw.pid)
        g = await chat_wave(urls, turns, timeout_s)
        gw_cpu = cpu_seconds(gw.pid) - cpu0
        rss_held = rss_bytes(gw.pid)
        with tempfile.TemporaryDirectory(prefix="agentrl-scale-gw-") as tmp:
            path = Path(tmp) / "sessions.json"
            await gw.ask(f"check {path}")
            record = json.loads(path.read_text())
        left_open = (await gw.ask("close"))["open_sessions"]
        rss_closed = rss_bytes(gw.pid)
        # A second wave of as many sessions: memory the first one left must be reused.
        again = await chat_wave((await gw.ask(f"open {sessions}"))["urls"], turns, timeout_s)
        left_open += (await gw.ask("close"))["open_sessions"]
        rss_again = rss_bytes(gw.pid)
        d = await direct_wave(url, record["sessions"], record["params"], timeout_s)
    finally:
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        backend.terminate()
        try:
            backend.wait(10)
        except subprocess.TimeoutExpired:
            backend.kill()
            backend.wait()
    lost = lost_sessions(record["sessions"], sessions, turns)
    gs, ds = g.summary(), d.summary()
    return {
        "sessions": sessions,
        "turns": turns,
        "gateway": gs,
        "direct": ds,
        "ratio_p50": gs["p50_ms"] / ds["p50_ms"],
        "ratio_p99": gs["p99_ms"] / ds["p99_ms"],
        "sessions_lost": sum(lost.values()),
        "lost_why": lost,
        "sessions_left_open": left_open,
        "errors": sum(w.errors.total() for w in (g, d, again)),
        "gateway_cpu_ms_per_request": 1e3 * gw_cpu / max(gs["requests"], 1),
        "gateway_rss_mib": {
            "after_warmup": rss0 / 2**20,
            "held": rss_held / 2**20,
            "after_close": rss_closed / 2**20,
            "after_second_wave": rss_again / 2**20,
        },
        "rss_kib_per_session": (rss_held - rss0) / 1024 / sessions,
        "rss_kept_after_close_kib_per_session": (rss_closed - rss0) / 1024 / sessions,
        "rss_regrowth_kib_per_session": (rss_again - rss_closed) / 1024 / sessions,
    }


def _print(r: dict[str, Any]) -> None:
    g, d = r["gateway"], r["direct"]
    print(f"{r['sessions']} concurrent sessions x {r['turns']} turns, real openai clients")
    for name, w in (("gateway", g), ("direct", d)):
        print(
            f"  {name:8s} requests={w['requests']} p50={w['p50_ms']:.1f} ms "
            f"p99={w['p99_ms']:.1f} ms max={w['max_ms']:.1f} ms "
            f"req/s={w['requests_per_s']:.0f} peak in flight={w['peak_inflight']} "
            f"errors={w['errors'] or 0}"
        )
    print(f"  gateway/direct latency: p50 {r['ratio_p50']:.2f}x, p99 {r['ratio_p99']:.2f}x")
    print(f"  gateway CPU per request: {r['gateway_cpu_ms_per_request']:.2f} ms")
    rss = r["gateway_rss_mib"]
    print(
        f"  gateway RSS: {rss['after_warmup']:.0f} MiB after warm-up, {rss['held']:.0f} MiB "
        f"with every session held ({r['rss_kib_per_session']:.1f} KiB/session), "
        f"{rss['after_close']:.0f} MiB after closing them, {rss['after_second_wave']:.0f} MiB "
        f"after a second wave ({r['rss_regrowth_kib_per_session']:.1f} KiB/session more; "
        f"limit {REGROWTH_LIMIT_KIB:g})"
    )
    print(
        f"  sessions lost: {r['sessions_lost']} {r['lost_why'] or ''}; "
        f"left open: {r['sessions_left_open']}"
    )
    print(json.dumps(r), flush=True)


def report_figures(r: dict[str, Any]) -> None:
    """The headline figures as BENCH-RESULT lines."""
    g, d = r["gateway"], r["direct"]
    report("sessions", r["sessions"], unit="sessions")
    report("sessions_lost", r["sessions_lost"], target=0, unit="sessions", better="lower")
    report("errors", r["errors"], target=0, unit="requests", better="lower")
    report("peak_requests_in_flight", g["peak_inflight"], unit="requests")
    report("latency_p50_ratio", r["ratio_p50"], unit="x", better="lower", baseline=d["p50_ms"])
    report("latency_p99_ratio", r["ratio_p99"], unit="x", better="lower", baseline=d["p99_ms"])
    report("gateway_latency_p50", g["p50_ms"], unit="ms", better="lower", baseline=d["p50_ms"])
    report("gateway_latency_p99", g["p99_ms"], unit="ms", better="lower", baseline=d["p99_ms"])
    cpu = r["gateway_cpu_ms_per_request"]
    report("gateway_cpu_per_request", cpu, unit="ms", better="lower")
    report("rss_per_session", r["rss_kib_per_session"], unit="KiB", better="lower")
    regrowth = r["rss_regrowth_kib_per_session"]
    report("rss_regrowth_per_session", regrowth, target=REGROWTH_LIMIT_KIB, unit="KiB",
           better="lower")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sessions", type=int, default=1000, help="Concurrent sessions.")
    p.add_argument("--turns", type=int, default=4, help="Chat completions per session.")
    p.add_argument("--quick", action="store_true", help="200 sessions x 2 turns (≤ 60 s).")
    p.add_argument("--timeout-s", type=float, default=600.0, help="Limit of each phase.")
    p.add_argument("--serve-gateway", metavar="BACKEND_URL", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve_gateway:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_gateway(a.serve_gateway, a.turns))
        return 0
    if a.quick:
        a.sessions, a.turns = 200, 2
    if a.sessions < 1 or a.turns < 1:
        p.error("--sessions and --turns must be at least 1")
    r = asyncio.run(run(a.sessions, a.turns, a.timeout_s))
    _print(r)
    report_figures(r)
    ok = r["sessions_lost"] == 0 and r["errors"] == 0 and r["sessions_left_open"] == 0
    return 0 if ok and r["rss_regrowth_kib_per_session"] <= REGROWTH_LIMIT_KIB else 1


if __name__ == "__main__":
    raise SystemExit(main())
