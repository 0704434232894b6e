"""A SWE training run end to end: does the held-out resolve rate rise, and where does time go.

Runs ``agentrl train --config configs/swe-smollm2.yaml`` (SmolLM2-135M on the ``tiny``
ladder, Docker sandboxes) as a subprocess while it counts the run's containers
(``docker ps`` by agentrl's owner label) every few seconds, then reads the run's
metrics.jsonl. Reports:

* held-out resolve rate before → after (the run's own evaluations) and the training curve
  (each step's resolve rate on its training episodes);
* episodes trained per hour of the training phase, the agent pool's busy share at
  episode ends, containers alive (peak, and after the run: must be 0);
* the split of the run's wall time: servers and start-up, evaluation, generation of
  training episodes, trainer update, weight sync; and within the episodes' own time:
  model generation, tool calls, env work (container set-up and grading), grading alone.

Target (issue #41): held-out gain >= +0.2 within 60 minutes on 2 cores.

Run: ``python -m benchmarks.swe_train [--config PATH] [--quick] [--from-run DIR] [--table]
[KEY=VALUE ...]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.sandbox.docker_owner import LABEL
from benchmarks.report import record, report

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/swe-smollm2.yaml"


def containers() -> int:
    """agentrl's containers alive on this engine now (-1 if docker does not answer)."""
    out = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label={LABEL}=1"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return len(out.stdout.split()) if out.returncode == 0 else -1


def _sum(lines: Sequence[Mapping[str, Any]], key: str) -> float:
    return sum(float(m.get(key, 0.0)) for m in lines)


def run_figures(run_dir: Path, wall_s: float) -> dict[str, Any]:
    """The run's figures from its metrics.jsonl, summary.json and trajectories."""
    from agentrl.reporting.run_dir import read_trajectories

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    train = sorted((m for m in lines if m.get("kind") == "train"), key=lambda m: m["step"])
    evals = sorted((m for m in lines if m.get("kind") == "eval"), key=lambda m: m["step"])
    if not train or len(evals) < 2:
        raise SystemExit("the run wrote no train steps or no before/after evaluation")
    seconds = json.loads((run_dir / "summary.json").read_text())["seconds"]
    wall_s = wall_s or float(seconds["total"])
    gen, upd, sync = (_sum(train, f"time/{k}") for k in ("generate", "update", "sync"))
    busy_s = gen + upd + sync  # the training steps' own time (no start-up, no evaluation)
    ev = float(seconds.get("evaluation", 0.0))
    steps = [read_trajectories(p) for p in sorted((run_dir / "trajectories").glob("step_*"))]
    episodes = [t for step in steps for t in step]
    ep_time = {
        k: sum(t.metrics.get(f"{k}_time_s", 0.0) for t in episodes)
        for k in ("generate", "tool", "env")
    }
    grading = sum(t.metrics.get("swe_grade_time_s", 0.0) for t in episodes)
    ep_total = sum(ep_time.values()) or 1.0
    busy = [t.metrics["swe_pool_busy"] for t in episodes if "swe_pool_busy" in t.metrics]
    return {
        "wall_s": wall_s,
        "steps": len(train),
        "before": float(evals[0]["success"]),
        "after": float(evals[-1]["success"]),
        "gain": float(evals[-1]["success"]) - float(evals[0]["success"]),
        "held_out_tasks": int(evals[0]["episodes"]),
        "curve": [
            round(statistics.fmean(t.metrics.get("swe_resolved", 0.0) for t in step), 3)
            for step in steps
        ],
        "episodes": len(episodes),
        "episodes_per_hour": len(episodes) / (busy_s / 3600) if busy_s else 0.0,
        "pool_busy": statistics.fmean(busy) if busy else None,
        "share": {
            "start_up": max(0.0, wall_s - gen - upd - sync - ev) / wall_s,
            "evaluation": ev / wall_s,
            "generation": gen / wall_s,
            "update": upd / wall_s,
            "sync": sync / wall_s,
        },
        "episode_share": {
            "model": ep_time["generate"] / ep_total,
            "tools": ep_time["tool"] / ep_total,
            "env": ep_time["env"] / ep_total,
            "grading": grading / ep_total,
        },
    }


class _Sampler(threading.Thread):
    def __init__(self, every_s: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.every_s, self._stop = every_s, threading.Event()
        self.counts: list[int] = []

    def run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.counts.append(containers())

    def stop(self) -> None:
        self._stop.set()
        self.join()


def train(config: str, overrides: Sequence[str], run_name: str) -> tuple[Path, float, list[int]]:
    """Runs the training job; returns its run directory, wall time and container counts."""
    sampler = _Sampler()
    sampler.start()
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "agentrl", "train", "--config", config,
           f"run_name={run_name}", *overrides]  # fmt: skip
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    wall = time.perf_counter() - t0
    sampler.stop()
    if rc != 0:
        raise SystemExit(f"agentrl train exited with {rc}")
    return ROOT / "runs" / run_name, wall, sampler.counts


def table(f: Mapping[str, Any]) -> str:
    share = ", ".join(f"{k} {v:.0%}" for k, v in f["share"].items())
    ep = ", ".join(f"{k} {v:.0%}" for k, v in f["episode_share"].items())
    busy = "n/a" if f.get("pool_busy") is None else f"{f['pool_busy']:.0%}"
    return "\n".join([
        "| held-out before | after | gain | steps | whole run | episodes/hour | pool busy "
        "| containers peak / after |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {f['before']:.3f} | {f['after']:.3f} | {f['gain']:+.3f} | {f['steps']} "
        f"| {f['wall_s'] / 60:.1f} min | {f['episodes_per_hour']:.0f} | {busy} "
        f"| {f.get('containers_peak', 'n/a')} / {f.get('containers_after', 'n/a')} |",
        "",
        f"Training curve (resolve rate of each step's episodes): {f['curve']}",
        f"Wall time: {share}. Episode time: {ep}.",
    ])  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--config", default=CONFIG)
    p.add_argument("--from-run", type=Path, help="report an existing run directory instead")
    p.add_argument("--wall-s", type=float, help="with --from-run: the run's wall time")
    p.add_argument("--table", action="store_true", help="print the recorded table and exit")
    p.add_argument("--quick", action="store_true", help="2 steps, 16 held-out tasks")
    p.add_argument("overrides", nargs="*", help="config overrides, KEY=VALUE")
    a = p.parse_args(argv)
    if a.table:
        print(table(json.loads((ROOT / "benchmarks" / "results.json").read_text())["swe_train"]))
        return 0
    counts: list[int] = []
    if a.from_run:
        run_dir, wall = a.from_run, a.wall_s or 0.0
    else:
        quick = ["steps=2", "eval.num_tasks=16"] if a.quick else []
        name = f"bench-swe-{int(time.time())}"
        run_dir, wall, counts = train(a.config, [*quick, *a.overrides], name)
    figures = run_figures(run_dir, wall)
    if counts:
        figures["containers_peak"] = max(counts)
    figures["containers_after"] = containers()
    figures["config"] = a.config
    figures["run"] = run_dir.name
    print(table(figures))
    record("swe_train", figures)
    report("swe_held_out_gain", figures["gain"], target=0.2, unit="abs")
    report("swe_whole_run_minutes", figures["wall_s"] / 60, target=60, unit="min", better="lower")
    return 0 if figures["containers_after"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
