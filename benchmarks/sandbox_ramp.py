"""A ramp of concurrent Docker sandboxes running SWE-style commands; past capacity, a queue.

**Queue.** A :class:`~agentrl.sandbox.docker_pool.DockerSandboxPool` of ``C`` containers
(``C`` = the first level, ``max_waiting=C``) gets ``2C`` requests at once: ``C`` are
leased, the other ``C`` must queue and then run (``queued_requests``; ``queue_failures``,
target 0; ``max_waiting_s``, the longest wait). While they wait, one request more must
be refused with one :class:`~agentrl.sandbox.docker_pool.PoolCapacityError` naming
``max_waiting`` (``queue_bound_refused`` = 1).

**Ramp.** One pool grows through ``--levels`` (default 8, 16, 32, 64, 128, 256
sandboxes, ``pool.resize``); each level's new sandboxes are leased by workers that set up
a small repository (two files, ``git init``), then loop what an SWE agent does: write a
file, ``grep -rn``, ``sed -i``, ``python3 -c``, ``python3 -m unittest`` of a 10-line
test, ``git diff``, pausing ``--think-s`` (jittered ±50%) between commands as an agent
waits for its model. The workers of earlier levels keep running, so a level holds that
many sandboxes at once for ``--level-s`` seconds, counted from the moment all are up.

Per level: exec latency p50/p99 (host-side, around the call), execs/s, failures (an
exception or an unexpected exit/output, with reasons), container start p50/p99
(``DockerSandbox.started_s``: create + start), host memory used (MemTotal - MemAvailable,
the level's peak) and dockerd's RSS (peak). The ramp **degrades** at the first level whose
exec p99 exceeds ``DEGRADE_FACTOR`` (4x) the first level's, or that has failures
(``degrades_at``; 0: none). Before a level, its memory is predicted from the last
level's per-sandbox share; a level that would leave less than ``MEM_RESERVE_GIB``
available (or that drops below it while running) is not held: the ramp stops there
(``stopped_at``, with the reason printed) instead of exhausting the machine.

Every container and volume carries this run's label (``agentrl.run``); after both pools
are closed, ``containers_left`` and ``volumes_left`` count those still there (target 0),
and a last sweep removes any (also after Ctrl-C or SIGTERM).

Run: ``python -m benchmarks.sandbox_ramp [--levels 8,16,...] [--level-s 600] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field

from agentrl.sandbox.base import SandboxLimits
from agentrl.sandbox.docker import RUN_ID, DockerSandbox
from agentrl.sandbox.docker_pool import DockerSandboxPool, PoolCapacityError
from benchmarks.report import report
from benchmarks.stats import percentile, rss_bytes

DEGRADE_FACTOR = 4.0  # exec p99 over the first level's: degraded
MEM_RESERVE_GIB = 3.0  # host memory a level must leave available
LIMITS = SandboxLimits(
    wall_timeout_s=60, cpu_time_s=30, memory_mb=256, max_processes=64,
    max_file_size_mb=16, max_disk_mb=32, max_output_bytes=64 << 10,
)  # fmt: skip
CALC = "VERSION = 0\n\n\ndef add(a, b):\n    return a + b\n"
TEST = """import unittest

import calc


class TestAdd(unittest.TestCase):
    def test_add(self):
        self.assertEqual(calc.add(2, 3), 5)

    def test_version(self):
        self.assertIsInstance(calc.VERSION, int)
"""
SETUP = "git init -q && git add -A && git -c user.name=a -c user.email=a@b commit -qm init"
# One SWE-style cycle: (step, shell command or None for a file write, text its stdout holds).
CYCLE: list[tuple[str, str | None, str]] = [
    ("write", None, ""),
    ("grep", "grep -rn 'def ' --include=*.py .", "calc.py"),
    ("sed", "sed -i 's/^VERSION = .*/VERSION = {k}/' calc.py && grep -c VERSION calc.py", "1"),
    ("python", "python3 -c 'import calc; print(calc.add(2, 3))'", "5"),
    ("unittest", "python3 -m unittest -q test_calc 2>&1 && echo PASSED", "PASSED"),
    ("git_diff", "git diff --stat", "calc.py"),
]


@dataclass
class Level:
    """What one level measured."""

    n: int
    lat: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    starts: list[float] = field(default_factory=list)
    mem_gib: float = 0.0
    dockerd_mib: float = 0.0
    running_s: float = 0.0
    running: bool = False
    held: bool = False


def meminfo_gib() -> tuple[float, float]:
    """(used, available) host memory in GiB: MemTotal - MemAvailable, MemAvailable."""
    kb = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            kb[k] = int(v.split()[0])
    return (kb["MemTotal"] - kb["MemAvailable"]) / 2**20, kb["MemAvailable"] / 2**20


def dockerd_rss_mib() -> float:
    """dockerd's RSS in MiB (0 where it is not found on this host)."""
    import os

    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "dockerd":
                    return rss_bytes(int(pid)) / 2**20
        except OSError:
            continue
    return 0.0


class Ramp:
    """The workers and the level in progress."""

    def __init__(self, think_s: float) -> None:
        self.think_s = think_s
        self.level: Level | None = None
        self.stop: str | None = None
        self.stopped = asyncio.Event()

    def fail(self, why: str) -> None:
        if self.level is not None:
            self.level.failures[why] += 1

    async def step(self, sb: DockerSandbox, k: int, name: str, cmd: str | None, want: str) -> bool:
        """Runs one command; False (and a failure recorded) where it failed."""
        t0 = time.perf_counter()
        try:
            if cmd is None:
                await sb.write_file(f"notes/n{k % 4}.txt", f"cycle {k}\n" * 20)
                out, code = "", 0
            else:
                r = await sb.exec(cmd.format(k=k))
                out, code = r.stdout, r.exit_code
        except Exception as e:
            self.fail(f"{name}: {type(e).__name__}: {str(e)[:80]}")
            return False
        lv = self.level
        if lv is not None and lv.running:
            lv.lat.append(time.perf_counter() - t0)
        if code != 0 or want not in out:
            self.fail(f"{name}: exit {code}, output {out[-60:]!r}")
            return False
        return True

    async def worker(self, pool: DockerSandboxPool, up: asyncio.Queue[float]) -> None:
        """Leases a sandbox, sets up the repository, then loops SWE-style commands."""
        try:
            sb = await pool.acquire()
            await sb.write_file("calc.py", CALC)
            await sb.write_file("test_calc.py", TEST)
            r = await sb.exec(SETUP)
            if not r.ok:
                raise RuntimeError(f"setup exit {r.exit_code}: {r.stderr[-80:]}")
        except Exception as e:
            self.fail(f"setup: {type(e).__name__}: {str(e)[:80]}")
            await up.put(-1.0)
            return
        await up.put(sb.started_s)
        k = 0
        while not sb.dead:
            k += 1
            for name, cmd, want in CYCLE:
                await asyncio.sleep(self.think_s * random.uniform(0.5, 1.5))
                await self.step(sb, k, name, cmd, want)

    async def next_up(self, up: asyncio.Queue[float]) -> float | None:
        """The start time of the next sandbox to come up (-1: it failed), or None once the
        ramp is stopped."""
        get = asyncio.create_task(up.get())
        stop = asyncio.create_task(self.stopped.wait())
        await asyncio.wait([get, stop], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not get.done():
            get.cancel()
            return None
        return get.result()

    async def sample(self) -> None:
        """Every 2 s: the level's peak memory and dockerd RSS; stops the ramp when the host
        runs short of memory."""
        while True:
            used, avail = meminfo_gib()
            lv = self.level
            if lv is not None:
                lv.mem_gib = max(lv.mem_gib, used)
                lv.dockerd_mib = max(lv.dockerd_mib, dockerd_rss_mib())
                if avail < MEM_RESERVE_GIB and self.stop is None:
                    self.stop = f"{avail:.1f} GiB available at {lv.n} sandboxes"
                    self.stopped.set()
            await asyncio.sleep(2.0)


async def queue_phase(image: str, cap: int) -> dict[str, float]:
    """``2 * cap`` requests at once to a pool of ``cap``; one more past ``max_waiting``."""
    waits: list[float] = []
    why: Counter[str] = Counter()
    probed = asyncio.Event()
    async with DockerSandboxPool(
        cap, image, LIMITS, health_interval_s=0, max_waiting=cap, acquire_timeout_s=300
    ) as pool:

        async def request(i: int) -> None:
            t0 = time.perf_counter()
            try:
                async with pool.sandbox() as sb:
                    waits.append(time.perf_counter() - t0)
                    r = await sb.exec(f"python3 -c 'print({i} * 2)'")
                    if r.stdout.strip() != str(i * 2):
                        why[f"exit {r.exit_code}"] += 1
                    await asyncio.wait_for(probed.wait(), 120)  # hold until the probe ran
            except Exception as e:
                why[f"{type(e).__name__}: {str(e)[:80]}"] += 1

        tasks = [asyncio.create_task(request(i)) for i in range(2 * cap)]
        refused, message = 0.0, ""
        try:
            for _ in range(2400):  # up to 120 s for the extra requests to queue
                if pool.waiting >= cap:
                    break
                await asyncio.sleep(0.05)
            try:
                sb = await pool.acquire()
                await pool.release(sb)
            except PoolCapacityError as e:
                refused, message = float("max_waiting" in str(e)), str(e)
        finally:
            probed.set()
            await asyncio.gather(*tasks)
        m = pool.metrics()
    print(f"queue: {2 * cap} requests at once to a pool of {cap} (max_waiting={cap}):")
    print(f"  queued {m['queued']:.0f}, failed {sum(why.values())} {dict(why) or ''}")
    print(f"  longest wait {max(waits, default=0):.2f} s; one more request: {message!r}")
    return {
        "queued_requests": m["queued"],
        "queue_failures": float(sum(why.values())),
        "max_waiting_s": max(waits, default=0.0),
        "queue_bound_refused": refused,
    }


async def ramp_phase(image: str, levels: list[int], level_s: float, think_s: float) -> list[Level]:
    """Holds each level's sandboxes for ``level_s``; the levels measured (held or not)."""
    ramp = Ramp(think_s)
    done: list[Level] = []
    workers: list[asyncio.Task[None]] = []
    base_gib = meminfo_gib()[0]
    sampler = asyncio.create_task(ramp.sample())
    pool = DockerSandboxPool(
        levels[0], image, LIMITS, health_interval_s=0, max_concurrent_starts=4,
        acquire_timeout_s=1800,
    )  # fmt: skip
    try:
        await pool.start(wait=False)
        for n in levels:
            used, avail = meminfo_gib()
            have = len(workers)
            per = (used - base_gib) / have if have else 0.0
            if have and avail - per * (n - have) < MEM_RESERVE_GIB:
                need = per * (n - have)
                ramp.stop = f"{n} sandboxes need ~{need:.1f} GiB more, {avail:.1f} available"
                done.append(Level(n))
                break
            lv = ramp.level = Level(n)
            done.append(lv)
            await pool.resize(n)
            up: asyncio.Queue[float] = asyncio.Queue()
            workers += [asyncio.create_task(ramp.worker(pool, up)) for _ in range(n - have)]
            for _ in range(n - have):
                started = await ramp.next_up(up)
                if started is None:
                    break
                if started >= 0:
                    lv.starts.append(started)
            if ramp.stop:
                break
            lv.running, t0 = True, time.perf_counter()
            try:
                await asyncio.wait_for(ramp.stopped.wait(), level_s)
            except TimeoutError:
                lv.held = True
            lv.running, lv.running_s = False, time.perf_counter() - t0
            _print_level(lv)
            if ramp.stop:
                break
    finally:
        for t in [*workers, sampler]:
            t.cancel()
        await asyncio.gather(*workers, sampler, return_exceptions=True)
        await pool.close()
    if ramp.stop:
        print(f"ramp stopped at {done[-1].n} sandboxes: {ramp.stop}")
    return done


def _print_level(lv: Level) -> None:
    print(
        f"{lv.n:4d} sandboxes: exec p50 {percentile(lv.lat, 50) * 1e3:7.1f} ms, "
        f"p99 {percentile(lv.lat, 99) * 1e3:7.1f} ms, {len(lv.lat) / lv.running_s:6.1f} execs/s, "
        f"start p50/p99 {percentile(lv.starts, 50) * 1e3:.0f}/"
        f"{percentile(lv.starts, 99) * 1e3:.0f} ms, host {lv.mem_gib:.1f} GiB, "
        f"dockerd {lv.dockerd_mib:.0f} MiB, failures {sum(lv.failures.values())} "
        f"{dict(lv.failures) or ''}",
        flush=True,
    )


def left_behind() -> tuple[int, int]:
    """Containers and volumes of this run still on the engine."""
    from agentrl.sandbox.images import docker_client

    client = docker_client()
    flt = {"label": f"agentrl.run={RUN_ID}"}
    return len(client.containers.list(all=True, filters=flt)), len(client.volumes.list(filters=flt))


def degrades_at(levels: list[Level]) -> int:
    """The first held level whose exec p99 exceeds DEGRADE_FACTOR x the first's, or with
    failures; 0 for none."""
    held = [lv for lv in levels if lv.lat]
    if not held:
        return 0
    first = percentile(held[0].lat, 99)
    for lv in held:
        if lv.failures or percentile(lv.lat, 99) > DEGRADE_FACTOR * first:
            return lv.n
    return 0


async def run(levels: list[int], level_s: float, think_s: float) -> int:
    from agentrl.sandbox.images import ensure_image

    image = ensure_image("python")
    q = await queue_phase(image, levels[0])
    done = await ramp_phase(image, levels, level_s, think_s)
    containers, volumes = left_behind()
    held = [lv for lv in done if lv.held]
    failures = sum(sum(lv.failures.values()) for lv in done)
    print(f"left behind: {containers} containers, {volumes} volumes")
    report("level_s", level_s, unit="s")
    report("levels_held", held[-1].n if held else 0, target=levels[-1], unit="sandboxes")
    report("stopped_at", 0 if len(held) == len(levels) else done[-1].n, unit="sandboxes")
    report("degrades_at", degrades_at(done), unit="sandboxes")
    report("failures", failures, target=0, unit="execs", better="lower")
    for lv in done:
        if not lv.lat:
            continue
        n = lv.n
        report(f"exec_p50_ms@{n}", percentile(lv.lat, 50) * 1e3, unit="ms", better="lower")
        report(f"exec_p99_ms@{n}", percentile(lv.lat, 99) * 1e3, unit="ms", better="lower")
        report(f"execs_per_s@{n}", len(lv.lat) / lv.running_s, unit="execs/s")
        report(f"failures@{n}", sum(lv.failures.values()), unit="execs", better="lower")
        report(f"start_p50_ms@{n}", percentile(lv.starts, 50) * 1e3, unit="ms", better="lower")
        report(f"start_p99_ms@{n}", percentile(lv.starts, 99) * 1e3, unit="ms", better="lower")
        report(f"host_mem_used@{n}", lv.mem_gib, unit="GiB", better="lower")
        report(f"dockerd_rss@{n}", lv.dockerd_mib, unit="MiB", better="lower")
    report("queued_requests", q["queued_requests"], unit="requests")
    report("queue_failures", q["queue_failures"], target=0, unit="requests", better="lower")
    report("max_waiting_s", q["max_waiting_s"], unit="s", better="lower")
    report("queue_bound_refused", q["queue_bound_refused"], target=1, unit="requests")
    report("containers_left", containers, target=0, unit="containers", better="lower")
    report("volumes_left", volumes, target=0, unit="volumes", better="lower")
    summary = {"levels": [lv.n for lv in done], "held": [lv.n for lv in held], **q}
    print(json.dumps(summary), flush=True)
    ok = not failures and not q["queue_failures"] and not containers and not volumes
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--levels", default="8,16,32,64,128,256", help="Sandboxes per level.")
    p.add_argument("--level-s", type=float, default=600.0, help="Seconds each level is held.")
    p.add_argument("--think-s", type=float, default=1.0, help="Mean pause between commands.")
    p.add_argument("--quick", action="store_true", help="Levels 2, 4 for ~5 s each.")
    a = p.parse_args(argv)
    if a.quick:
        a.levels, a.level_s = "2,4", 5.0
    levels = [int(x) for x in a.levels.split(",") if x.strip()]
    if not levels or levels != sorted(set(levels)) or levels[0] < 1 or a.level_s <= 0:
        p.error("--levels must be increasing positive counts and --level-s positive")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # killed: clean up as on Ctrl-C
    try:
        return asyncio.run(run(levels, a.level_s, a.think_s))
    finally:
        from agentrl.runtime.watchdog import remove_docker

        remove_docker({"agentrl.run": RUN_ID})  # whatever a crash or Ctrl-C left


if __name__ == "__main__":
    raise SystemExit(main())
