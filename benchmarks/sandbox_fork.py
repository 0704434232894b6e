"""LocalSandbox fork latency against a fresh sandbox, in one run on this machine.

A tree rollout branches an episode's sandbox (``LocalSandbox.fork``): a new sandbox whose
files are a copy of the parent's. Times, ``--n`` samples each, p50 and p99 in ms:

* fresh: ``LocalSandbox(limits).start()`` (the baseline: what an independent episode pays);
* fork: ``await parent.fork()`` of a parent whose workspace holds ``--files`` files of
  ``--kb`` KiB (a fresh start plus the copy through the two helpers' pipes).

Prints the fork / fresh ratio at p50 and p99. Needs root (as LocalSandbox).
Run: ``nice -n 10 python -m benchmarks.sandbox_fork [--n 20 --files 50 --kb 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from agentrl.sandbox import LocalSandbox, SandboxLimits
from benchmarks.report import report
from benchmarks.stats import percentile


async def timed(n: int, make: Callable[[], Awaitable[LocalSandbox]]) -> list[float]:
    """Milliseconds to get each of ``n`` started sandboxes (closed after, untimed)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        sb = await make()
        out.append((time.perf_counter() - t0) * 1e3)
        await sb.close()
    return out


async def fresh(limits: SandboxLimits) -> LocalSandbox:
    sb = LocalSandbox(limits)
    await sb.start()
    return sb


def row(name: str, xs: list[float]) -> str:
    return f"{name:<34} p50 {percentile(xs, 50):8.2f} ms   p99 {percentile(xs, 99):8.2f} ms"


async def main(n: int, files: int, kb: int) -> None:
    limits = SandboxLimits(max_disk_mb=max(64, 2 * files * kb // 1024 + 8))
    print(f"LocalSandbox fork vs fresh, {n} samples each, workspace {files} x {kb} KiB\n")
    await (await fresh(limits)).close()  # warm-up (page cache, cgroup setup)
    base = await timed(n, lambda: fresh(limits))
    async with LocalSandbox(limits) as parent:
        for i in range(files):
            await parent.write_file(f"d{i % 10}/f{i}.bin", bytes(kb * 1024))
        forks = await timed(n, parent.fork)
    print(row("fresh sandbox (start)", base))
    print(row(f"fork ({files} files x {kb} KiB)", forks))
    for q in (50, 99):
        ratio = percentile(forks, q) / percentile(base, q)
        print(f"fork / fresh at p{q}: {ratio:.2f}x")
        report(f"fork_vs_fresh_p{q}", ratio, unit="x", better="lower", baseline=percentile(base, q))
    report("fork_p50_ms", percentile(forks, 50), unit="ms", better="lower")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--kb", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.n, args.files, args.kb))
