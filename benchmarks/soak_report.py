"""The soak's figures: what it prints, as ``BENCH-RESULT`` lines and a summary.

Growth figures are least-squares slopes per hour over the *window*: the samples after
the last restart of the run plus ``Plan.warmup_frac`` of the soak (a restarted process
grows while it warms up; before the last restart the processes were others).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.report import report as figure
from benchmarks.soak_probe import Sample, slope, throughput
from tests.chaos.harness import account, train_steps

if TYPE_CHECKING:
    from benchmarks.soak import Soak

MIB = 1 << 20
# Growth past warm-up that counts as a leak (per hour of the window).
RSS_LIMIT_MIB_H = 32.0
FDS_LIMIT_H = 10.0
THREADS_LIMIT_H = 10.0
CONTAINERS_LIMIT_H = 1.0
SHM_LIMIT_MIB_H = 1.0
THROUGHPUT_FLOOR = 0.8


def window(soak: Soak) -> list[Sample]:
    """The samples the growth and throughput figures are read from."""
    first = next((s.t for s in soak.samples if s.steps > 0), 0.0)
    begin = max([first, *soak.restarts]) + soak.plan.warmup_frac * soak.plan.seconds
    return [s for s in soak.samples if s.t >= begin and s.run.procs > 0]


def _quarters(w: Sequence[Sample]) -> tuple[float, float]:
    q = max(2, len(w) // 4)
    return throughput(w[:q]), throughput(w[-q:])


def report(soak: Soak, leaks: list[str], error: str, keep: Path | None = None) -> int:
    """Prints the figures of a finished (or failed) soak; returns the exit status."""
    w = window(soak)
    b = soak.books() if soak.run_dir.exists() else None
    acc = account(soak.run_dir) if b is not None and b.steps else None
    steps = train_steps(soak.run_dir) if soak.run_dir.exists() else []
    start_tps, end_tps = _quarters(w)
    growth = {
        "rss_run_growth": slope([(s.t, s.run.rss_bytes / MIB) for s in w]),
        "fds_run_growth": slope([(s.t, s.run.fds) for s in w]),
        "threads_run_growth": slope([(s.t, s.run.threads) for s in w]),
        "containers_growth": slope([(s.t, s.containers) for s in w]),
        "shm_growth": slope([(s.t, s.agentrl_shm_bytes / MIB) for s in w]),
    }
    recov = [e.recovery_s for e in soak.events if e.recovery_s is not None]
    for e in soak.events:
        print(f"  t={e.t:7.0f}s  {e.fault:15} {'ok ' if e.ok else 'FAILED'} "
              f"recovered {e.recovery_s}s  {e.detail}")  # fmt: skip
    if b is not None:
        print(f"  episodes: generated {b.generated}, trained {b.trained}, discarded "
              f"{dict(b.discarded)}, dropped with their group {b.dropped_with_group} "
              f"({dict(b.group_drops)}), superseded {b.superseded_episodes} in "
              f"{b.superseded_steps} steps; steps whose discarded file disagrees with "
              f"their count: {b.mismatched_steps}")  # fmt: skip
    if w:
        print(f"  window {w[0].t:.0f}-{w[-1].t:.0f}s ({len(w)} samples); run RSS "
              f"{w[0].run.rss_bytes / MIB:.0f} → {w[-1].run.rss_bytes / MIB:.0f} MiB, fds "
              f"{w[0].run.fds} → {w[-1].run.fds}, threads {w[0].run.threads} → "
              f"{w[-1].run.threads}, containers {w[0].containers} → "
              f"{w[-1].containers}")  # fmt: skip
    if error:
        print(f"soak FAILED: {error}")
    if leaks:
        print(f"left behind: {leaks}")
    if keep is not None:
        keep.write_text(json.dumps({
            "plan": soak.plan.__dict__, "error": error, "leaks": leaks,
            "events": [e.__dict__ for e in soak.events],
            "samples": [s.row() for s in soak.samples],
        }, indent=1))  # fmt: skip

    ran = (w[-1].t - w[0].t) / 60 if len(w) > 1 else 0.0
    figure("minutes", soak.plan.minutes, unit="min")
    figure("window_minutes", ran, unit="min")
    figure("steps", max(steps, default=0), unit="steps")
    figure("faults_injected", len(soak.events), unit="faults")
    figure("faults_failed", sum(not e.ok for e in soak.events) + bool(error), target=0,
           unit="faults", better="lower")  # fmt: skip
    figure("recovery_max", max(recov, default=float("nan")), unit="s", better="lower")
    figure("recovery_p50", statistics.median(recov) if recov else float("nan"), unit="s",
           better="lower")  # fmt: skip
    if b is not None:
        figure("episodes_generated", b.generated + b.superseded_episodes, unit="episodes")
        figure("episodes_trained", b.trained, unit="episodes")
        figure("episodes_discarded", sum(b.discarded.values()) + b.dropped_with_group
               + b.superseded_episodes, unit="episodes")  # fmt: skip
        figure("episodes_unaccounted", abs(b.unaccounted) + len(b.mismatched_steps),
               target=0, unit="episodes", better="lower")  # fmt: skip
    if acc is not None:
        figure("tasks_lost", acc.lost, target=0, unit="tasks", better="lower")
        figure("tasks_trained_twice", acc.duplicated, target=0, unit="tasks", better="lower")
    once = steps == list(range(1, len(steps) + 1))
    figure("steps_not_logged_once", 0 if once else 1, target=0, unit="runs", better="lower")
    limits = {"rss_run_growth": (RSS_LIMIT_MIB_H, "MiB/h"), "fds_run_growth": (FDS_LIMIT_H,
              "fds/h"), "threads_run_growth": (THREADS_LIMIT_H, "threads/h"),
              "containers_growth": (CONTAINERS_LIMIT_H, "containers/h"),
              "shm_growth": (SHM_LIMIT_MIB_H, "MiB/h")}  # fmt: skip
    for name, value in growth.items():
        limit, unit = limits[name]
        figure(name, value, target=limit, unit=unit, better="lower")
    if w:
        figure("rss_servers_max", max(s.servers.rss_bytes for s in w) / MIB, unit="MiB")
        figure("shm_all_max", max(s.shm_bytes for s in w) / MIB, unit="MiB")
    figure("throughput_end_vs_start", end_tps / start_tps if start_tps else float("nan"),
           target=THROUGHPUT_FLOOR, unit="x")  # fmt: skip
    figure("left_behind", len(leaks), target=0, unit="items", better="lower")
    lost = bool(error) or bool(leaks) or not once
    lost |= b is None or b.unaccounted != 0 or bool(b.mismatched_steps)
    lost |= acc is None or acc.lost != 0 or acc.duplicated != 0
    return 1 if lost else 0
