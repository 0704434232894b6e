"""What the soak samples every interval, and the growth it reads from the samples.

A :class:`Sample` is one look at the run: RSS, open file descriptors and threads summed
over the run's own processes (those whose environment carries its case marker,
:func:`tests.chaos.harness.case_pids`) and over the vLLM servers' process groups, the
run's live sandbox containers, the bytes of ``/dev/shm`` (agentrl's own, and all) and the
model tokens the run trained on so far. :func:`slope` is the least-squares growth of one
resource per hour.

>>> slope([(0.0, 1.0), (1800.0, 2.0), (3600.0, 3.0)])
2.0
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcStats:
    """RSS, open fds and threads summed over a set of processes."""

    procs: int = 0
    rss_bytes: int = 0
    fds: int = 0
    threads: int = 0


def proc_stats(pids: Iterable[int]) -> ProcStats:
    """Sums :class:`ProcStats` over ``pids`` (a process gone meanwhile counts as nothing)."""
    n = rss = fds = threads = 0
    for pid in pids:
        try:
            statm = Path(f"/proc/{pid}/statm").read_text().split()
            status = Path(f"/proc/{pid}/status").read_text()
            nfd = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        n += 1
        rss += int(statm[1]) * PAGE
        fds += nfd
        threads += next(
            (int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:")),
            0,
        )
    return ProcStats(n, rss, fds, threads)


def group_pids(pgids: Iterable[int]) -> list[int]:
    """Live processes of the given process groups (the vLLM servers and their workers)."""
    want = set(pgids)
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) in want:
            out.append(int(name))
    return out


def live_containers(owner_pid: int | None) -> int:
    """Running or created sandbox containers owned by process ``owner_pid`` (-1 on an
    engine that does not answer)."""
    if owner_pid is None:
        return 0
    try:
        r = subprocess.run(
            ["docker", "ps", "-aq", "--filter", "label=agentrl.sandbox=1",
             "--filter", f"label=agentrl.pid={owner_pid}"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return -1
    return len(r.stdout.split())


def shm_bytes() -> int:
    """Bytes in use on ``/dev/shm`` (every file: vLLM's own too)."""
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def agentrl_shm_bytes(root: str = "/dev/shm") -> int:
    """Bytes of agentrl's own entries in ``/dev/shm`` (weights handed to the servers)."""
    total = 0
    for entry in Path(root).glob("agentrl*"):
        paths = [entry] if entry.is_file() else list(entry.rglob("*"))
        for f in paths:
            try:
                total += f.stat().st_size if f.is_file() else 0
            except OSError:
                continue
    return total


@dataclass(frozen=True)
class Sample:
    """One look at the run, ``t`` seconds after the soak started."""

    t: float
    run: ProcStats
    servers: ProcStats
    containers: int
    shm_bytes: int
    agentrl_shm_bytes: int
    model_tokens: float
    steps: int
    phase: str

    def row(self) -> dict[str, Any]:
        """Flat, JSON-ready."""
        d = asdict(self)
        for k in ("run", "servers"):
            d.update({f"{k}_{f}": v for f, v in d.pop(k).items()})
        return d


def take(
    t0: float,
    run_pids: Sequence[int],
    server_pgids: Sequence[int],
    owner_pid: int | None,
    model_tokens: float,
    steps: int,
    phase: str,
) -> Sample:
    """A :class:`Sample` now."""
    return Sample(
        t=time.monotonic() - t0,
        run=proc_stats(run_pids),
        servers=proc_stats(group_pids(server_pgids)),
        containers=live_containers(owner_pid),
        shm_bytes=shm_bytes(),
        agentrl_shm_bytes=agentrl_shm_bytes(),
        model_tokens=model_tokens,
        steps=steps,
        phase=phase,
    )


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of ``(seconds, value)`` points, per hour (0 with < 2 points)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mx) * (v - my) for t, v in points) / var * 3600.0


def throughput(samples: Sequence[Sample]) -> float:
    """Model tokens trained per second between the first and last of ``samples``."""
    if len(samples) < 2 or samples[-1].t <= samples[0].t:
        return 0.0
    return (samples[-1].model_tokens - samples[0].model_tokens) / (samples[-1].t - samples[0].t)
