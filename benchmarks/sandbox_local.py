"""LocalSandbox latency: pool acquire, exec round trip, cold start, against plain subprocess.

Times, in one run on this machine:

* pool acquire: entering ``async with pool.acquire()`` on a warm pool (target ≤ 10 ms);
* exec round trip of ``true`` (argv), ``sh -c 'echo hi'`` and ``python3 -c 'print(1)'``
  in a sandbox (target p50 ≤ 10 ms for the first two), each next to the same command
  run by a plain ``asyncio.create_subprocess_exec`` with no isolation (the baseline);
* cold start of a sandbox (``start()``: unshare + helper + private root);
* ``python3 -c`` warm (a fork of the sandbox's started interpreter, the default) against
  cold (one extra env variable, so a fresh ``python3`` is exec'd: the behaviour before
  warm Python), the ratio cold / warm.

Prints p50/p95 in ms and the sandbox / baseline ratio. Needs root.
Run: ``python -m benchmarks.sandbox_local [--n 200 --pool-size 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from agentrl.sandbox import LocalSandbox, SandboxLimits, SandboxPool
from benchmarks.report import report

COMMANDS: dict[str, list[str]] = {
    "true": ["/usr/bin/true"],
    "sh echo": ["/bin/sh", "-c", "echo hi"],
    "python3 print": ["/usr/bin/python3", "-c", "print(1)"],
}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def timed(n: int, fn: Callable[[], Awaitable[object]]) -> list[float]:
    await fn()  # warm-up
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


async def baseline(argv: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    await proc.communicate()


def row(name: str, xs: list[float], base: list[float] | None = None) -> str:
    line = f"{name:<28} p50 {pct(xs, 0.5):7.2f} ms   p95 {pct(xs, 0.95):7.2f} ms"
    if base:
        line += f"   ratio p50 {pct(xs, 0.5) / pct(base, 0.5):5.2f}x vs subprocess"
    return line


async def main(n: int, pool_size: int) -> None:
    limits = SandboxLimits()
    print(f"LocalSandbox latency, {n} samples each\n")

    starts = []
    for _ in range(max(5, n // 20)):
        t0 = time.perf_counter()
        sb = LocalSandbox(limits)
        await sb.start()
        starts.append((time.perf_counter() - t0) * 1e3)
        await sb.close()
    print(row("cold start()", starts))

    async with SandboxPool(lambda: LocalSandbox(limits), size=pool_size) as pool:
        for _ in range(n):
            async with pool.acquire() as sb:
                await sb.exec(["true"])
            await asyncio.sleep(0.002)  # let the background reset finish, as between episodes
        m = pool.metrics
        print(
            f"{'pool acquire (warm)':<28} p50 {m['acquire_ms_p50']:7.3f} ms   "
            f"p95 {m['acquire_ms_p95']:7.3f} ms   (target <= 10 ms)"
        )
        report("pool_acquire_p50_ms", m["acquire_ms_p50"], target=10, unit="ms", better="lower")

        async with pool.acquire() as sb:
            for name, argv in COMMANDS.items():
                base = await timed(n, lambda argv=argv: baseline(argv))
                box = await timed(n, lambda argv=argv: sb.exec(argv))
                print(row(f"subprocess {name}", base))
                print(row(f"sandbox exec {name}", box, base))
                report(f"exec_{name.replace(' ', '_')}_p50_ms", pct(box, 0.5), unit="ms",
                       target=10 if name != "python3 print" else None, better="lower",
                       baseline=pct(base, 0.5))  # fmt: skip
            argv = COMMANDS["python3 print"]
            warm = await timed(n, lambda: sb.exec(argv))
            cold = await timed(n, lambda: sb.exec(argv, env={"AGENTRL_BENCH_COLD": "1"}))
            print(row("sandbox python3 cold", cold))
            print(row("sandbox python3 warm", warm))
            speedup = pct(cold, 0.5) / pct(warm, 0.5)
            print(f"warm python3 -c: {speedup:.2f}x faster than a fresh interpreter (p50)")
            report("python3_warm_speedup_vs_cold", speedup, unit="x", baseline=pct(cold, 0.5))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--pool-size", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.n, args.pool_size))
