"""10,000 episodes through the AgentLoop: the driver's memory stays flat.

A small multi-turn env with a tool (``Sum``: the model calls ``add``, reads the result,
answers) runs ``--episodes`` episodes through one :class:`~agentrl.rollout.AgentLoop`
and one :class:`~agentrl.rollout.RolloutRunner`, reused for every batch as a training
driver reuses them: batches of ``--batch`` episodes, ``--concurrency`` in flight, each
batch's trajectories checked and then dropped (as after a training step). The policy is
the scripted server (``agentrl.testing.scripted_server``'s app over a scripted
hermes-format policy) in a subprocess, reached over HTTP by ``CompletionsClient``, so
this process holds the driver alone.

The driver's RSS is sampled after every batch (after ``gc.collect()``). Reported: RSS
after the warm-up (the first ``--warmup`` share of the episodes) and at the end, the
least-squares slope in bytes/episode after the warm-up, episodes/s, and episodes that
did not end as expected (stop ``done``, reward 1, 2 turns, 1 tool call; target 0).

Flat means a slope ≤ 1 KiB/episode (``SLOPE_LIMIT``). One kept trajectory of this env
is ~20 KiB (``kept_trajectory_bytes`` prints it: its token ids, mask, logprobs,
versions, messages), so keeping even a tenth of each episode's trajectory crosses
the limit; at the limit 10,000 episodes would add 10 MiB. Below it, RSS moves by
allocator noise (pymalloc arenas, ~1 MiB) that the slope over tens of samples averages
out.

Run: ``python -m benchmarks.scale_episodes [--episodes 10000] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import re
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from agentrl import Action, Env, Message, StepResult
from agentrl.tools import tool
from benchmarks.local_http import start_http
from benchmarks.report import report
from benchmarks.stats import after_warmup, rss_bytes, slope

SLOPE_LIMIT = 1024.0  # bytes/episode after warm-up: "flat" (see the module docstring)
REQUEST_TIMEOUT_S = 60.0


class Sum(Env):
    """Asks for a sum; the model may call ``add``; ``ANSWER n`` ends the episode."""

    max_turns = 4

    def reset(self, task: Any, *, seed: int | None = None) -> list[Message]:
        self.a, self.b = task["a"], task["b"]
        return [Message.system("Use tools."), Message.user(f"What is {self.a}+{self.b}?")]

    @tool
    def add(self, a: int, b: int) -> int:
        """Adds two integers.

        Args:
            a: First addend.
            b: Second addend.
        """
        return a + b

    def tools(self) -> list[Any]:
        return [self.add]

    def step(self, action: Action) -> StepResult:
        m = re.search(r"ANSWER (\d+)", action.content)
        if m:
            return StepResult(reward=float(int(m.group(1)) == self.a + self.b), terminated=True)
        return StepResult()


def tool_then_answer(prompt: str) -> str:
    """The scripted policy: call ``add`` first, then answer with what the tool said."""
    responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt, re.S)
    if not responses:
        a, b = re.findall(r"What is (\d+)\+(\d+)\?", prompt)[-1]
        return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    return f"ANSWER {responses[-1]}"


def serve(port: int) -> None:
    """The scripted server subprocess (foreground until killed)."""
    import uvicorn

    from agentrl.models.tokenizer import build_tokenizer
    from agentrl.testing.scripted_server import TextPolicy, make_app

    app = make_app(TextPolicy(build_tokenizer(seed=0), tool_then_answer))
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    asyncio.run(uvicorn.Server(config).serve())


def unexpected(traj: Any) -> str | None:
    """Why an episode did not end as this env's scripted one must, or None."""
    if str(traj.stop_reason) != "done" or traj.error:
        return f"stop {traj.stop_reason}"
    if traj.reward != 1.0:
        return f"reward {traj.reward}"
    if traj.num_turns != 2 or traj.metrics.get("tool_calls") != 1:
        return f"{traj.num_turns} turns, {traj.metrics.get('tool_calls')} tool calls"
    return None


def kept_trajectory_bytes(traj: Any) -> int:
    """Bytes one trajectory holds in its lists and messages (what a leak would keep)."""
    seen: set[int] = set()

    def size(o: Any) -> int:
        if id(o) in seen or (isinstance(o, int) and -5 <= o <= 256):
            return 0
        seen.add(id(o))
        n = sys.getsizeof(o)
        if isinstance(o, dict):
            return n + sum(size(k) + size(v) for k, v in o.items())
        if isinstance(o, list | tuple | set):
            return n + sum(size(x) for x in o)
        if hasattr(o, "__dict__"):
            return n + size(vars(o))
        if hasattr(o, "__slots__"):
            return n + sum(size(getattr(o, a, None)) for a in o.__slots__)
        return n

    return size(traj)


async def run(
    episodes: int, batch: int, concurrency: int, warmup: float, timeout_s: float
) -> dict[str, Any]:
    """Runs the episodes; the server subprocess is gone when it returns."""
    from agentrl.inference.client import CompletionsClient
    from agentrl.models.tokenizer import build_tokenizer
    from agentrl.rollout import AgentLoop, LoopConfig, RolloutRunner

    tok = build_tokenizer(seed=0)
    cfg = LoopConfig(max_turns=4, max_total_tokens=4096, max_tokens_per_turn=128)
    srv, url = start_http(
        lambda port: [sys.executable, "-m", "benchmarks.scale_episodes", "--serve", str(port)]
    )
    samples: list[tuple[int, int]] = []
    why: Counter[str] = Counter()
    traj_bytes = 0
    try:
        async with CompletionsClient(url, timeout_s=REQUEST_TIMEOUT_S) as client:
            runner = RolloutRunner(AgentLoop(client, tok, cfg), Sum, max_concurrency=concurrency)
            gc.collect()
            samples.append((0, rss_bytes()))
            done, t0 = 0, time.perf_counter()
            async with asyncio.timeout(timeout_s):
                while done < episodes:
                    n = min(batch, episodes - done)
                    tasks = [{"id": done + i, "a": done + i, "b": 7} for i in range(n)]
                    result = await runner.run(tasks)
                    trajs = result.trajectories
                    why["missing"] += n - len(trajs)
                    why.update(w for w in map(unexpected, trajs) if w)
                    if not traj_bytes and trajs:
                        traj_bytes = kept_trajectory_bytes(trajs[0])
                    del result, trajs
                    done += n
                    gc.collect()
                    samples.append((done, rss_bytes()))
            wall = time.perf_counter() - t0
    finally:
        srv.terminate()
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
    return summarize(samples, episodes, warmup, wall, why, traj_bytes)


def summarize(
    samples: list[tuple[int, int]],
    episodes: int,
    warmup: float,
    wall_s: float,
    why: Counter[str],
    traj_bytes: int = 0,
) -> dict[str, Any]:
    """The figures from the RSS samples ``(episodes done, bytes)``: RSS at the end of the
    warm-up and at the end, and the slope over the samples from the warm-up on."""
    start = warmup * episodes
    steady = after_warmup(samples, start)
    if len(steady) < 2:
        raise ValueError(
            f"{len(steady)} RSS sample(s) after the warm-up: use more --episodes, a smaller "
            "--batch or a shorter --warmup"
        )
    xs, ys = zip(*steady, strict=True)
    b = slope(xs, ys)
    return {
        "episodes": episodes,
        "episodes_per_s": episodes / wall_s,
        "wall_s": wall_s,
        "rss_start_mib": samples[0][1] / 2**20,
        "rss_warm_mib": steady[0][1] / 2**20,
        "rss_end_mib": samples[-1][1] / 2**20,
        "slope_bytes_per_episode": b,
        "slope_limit": SLOPE_LIMIT,
        "flat": b <= SLOPE_LIMIT,
        "samples_after_warmup": len(steady),
        "unexpected": sum(why.values()),
        "unexpected_why": {k: v for k, v in why.items() if v},
        "kept_trajectory_bytes": traj_bytes,
    }


def _print(r: dict[str, Any]) -> None:
    print(f"{r['episodes']} episodes (2 turns, 1 tool call each) through one AgentLoop")
    print(
        f"  {r['episodes_per_s']:.0f} episodes/s; driver RSS {r['rss_start_mib']:.0f} MiB at "
        f"start, {r['rss_warm_mib']:.0f} MiB after warm-up, {r['rss_end_mib']:.0f} MiB at end"
    )
    verdict = "flat" if r["flat"] else "GROWING"
    print(
        f"  slope after warm-up: {r['slope_bytes_per_episode']:.0f} bytes/episode over "
        f"{r['samples_after_warmup']} samples ({verdict}: limit {SLOPE_LIMIT:.0f}; one kept "
        f"trajectory is {r['kept_trajectory_bytes']} bytes)"
    )
    print(f"  unexpected episodes: {r['unexpected']} {r['unexpected_why'] or ''}")
    print(json.dumps(r), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--episodes", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=250, help="Episodes per batch (RSS sample).")
    p.add_argument("--concurrency", type=int, default=128, help="Episodes in flight.")
    p.add_argument("--warmup", type=float, default=0.2, help="Share of episodes not in the slope.")
    p.add_argument("--quick", action="store_true", help="2,000 episodes (≤ 60 s).")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="Limit of the whole run.")
    p.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve:
        serve(a.serve)
        return 0
    if a.quick:
        a.episodes, a.batch = 2000, 100
    if a.episodes < 1 or a.batch < 1 or not 0 <= a.warmup < 1:
        p.error("--episodes and --batch must be at least 1, --warmup in [0, 1)")
    r = asyncio.run(run(a.episodes, a.batch, a.concurrency, a.warmup, a.timeout_s))
    _print(r)
    report("episodes", r["episodes"], unit="episodes")
    report("episodes_per_s", r["episodes_per_s"], unit="episodes/s")
    report("unexpected_episodes", r["unexpected"], target=0, unit="episodes", better="lower")
    report("rss_warm", r["rss_warm_mib"], unit="MiB", better="lower")
    report("rss_end", r["rss_end_mib"], unit="MiB", better="lower", baseline=r["rss_warm_mib"])
    b = r["slope_bytes_per_episode"]
    report("rss_slope", b, target=SLOPE_LIMIT, unit="B/episode", better="lower")
    return 0 if r["flat"] and not r["unexpected"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
