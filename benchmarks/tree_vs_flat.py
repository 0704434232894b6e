"""Tree credit against flat GRPO on the SmolLM2 retool preset, over seeds (issue #45).

For each seed (``--seeds``, default 3) runs ``agentrl train`` twice as subprocesses,
interleaved seed by seed (flat s0, tree s0, flat s1, …) so machine noise falls on both
arms alike: the flat arm ``configs/retool.yaml`` (GRPO, independent episodes) and the tree
arm ``configs/retool-smollm2-tree.yaml`` (``rollout.tree``, ``tree_grpo``). Both get the
same overrides (``seed=``, ``--quick`` sizes, yours); before anything runs the resolved
configs are compared and must differ only in ``rollout.tree`` and the estimator. The
tree preset caps a tree's generated tokens at what its leaves could generate flat
(``max_tree_tokens``): the same generated-token budget. Reports, per run and per arm
(mean and min–max over seeds), then tree/flat:

* generated model tokens per training step and per episode (flat: an episode's model
  tokens; tree: a leaf's ``tree_generated_tokens``, a shared turn counted once), and each
  leaf's prefix reuse (the share of its model tokens it did not generate itself);
* held-out success before → after (the runs' own flat evaluations) and the gain;
* wall time: the training steps (generation + update + weight sync) and the whole run.
  Both arms run the same number of steps, so "after the same wall time" holds only as far
  as their wall times agree: the table says which arm was slower.

Records ``tree_vs_flat`` (a ``table``, the per-run figures) in benchmarks/results.json.

Run: ``python -m benchmarks.tree_vs_flat [--seeds N] [--lock PATH] [--nice N] [--quick]
[--reuse] [--from-runs DIR ...] [KEY=VALUE ...]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks.report import record, report

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"flat": "configs/retool.yaml", "tree": "configs/retool-smollm2-tree.yaml"}
# The keys the two arms may differ in; any other difference is an unfair comparison.
ALLOWED = ("rollout.tree", "trainer.advantage.estimator")
QUICK = ["steps=2", "eval.num_tasks=16"]
# Per-run figures summarised per arm: (key, label, format).
ROWS = [
    ("gen_tokens_per_step", "generated tokens / step", "{:.0f}"),
    ("gen_tokens_per_episode", "generated tokens / episode (leaf)", "{:.1f}"),
    ("model_tokens_per_episode", "model tokens / episode (leaf)", "{:.1f}"),
    ("prefix_reuse", "prefix reuse (share of a leaf's tokens shared)", "{:.2f}"),
    ("episodes_per_step", "episodes (leaves) / step", "{:.1f}"),
    ("before", "held-out success before", "{:.3f}"),
    ("after", "held-out success after", "{:.3f}"),
    ("gain", "held-out gain", "{:+.3f}"),
    ("train_s", "training steps wall time (s)", "{:.0f}"),
    ("whole_s", "whole run wall time (s)", "{:.0f}"),
]


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(overrides: Sequence[str]) -> list[str]:
    """The resolved config keys in which the arms differ, given the same overrides.

    Raises:
        SystemExit: They differ elsewhere than ``rollout.tree`` and the estimator.
    """
    from agentrl.config import load_config

    flat, tree = (
        _flatten(load_config(ROOT / ARMS[a], list(overrides)).model_dump(mode="json"))
        for a in ("flat", "tree")
    )
    keys = sorted(k for k in flat.keys() | tree.keys() if flat.get(k) != tree.get(k))
    unfair = [k for k in keys if not k.startswith(ALLOWED)]
    if unfair:
        raise SystemExit(f"the arms differ beyond {', '.join(ALLOWED)}: {', '.join(unfair)}")
    return keys


def _generated(t: Any) -> float:
    """Model tokens generated for this episode alone (a tree's shared turns counted once)."""
    if "tree" in t.info:
        return float(t.metrics.get("tree_generated_tokens", 0.0))
    return float(t.num_model_tokens)


def run_figures(run_dir: Path) -> dict[str, Any]:
    """One run's figures from its config.yaml, metrics.jsonl, summary.json and trajectories."""
    from agentrl.reporting.run_dir import read_trajectories

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    train = [m for m in lines if m.get("kind") == "train"]
    evals = sorted((m for m in lines if m.get("kind") == "eval"), key=lambda m: m["step"])
    steps = [read_trajectories(p) for p in sorted((run_dir / "trajectories").glob("step_*"))]
    episodes = [t for step in steps for t in step]
    if not train or len(evals) < 2 or not episodes:
        raise SystemExit(f"{run_dir}: no train steps, episodes or before/after evaluation")
    gen = sum(_generated(t) for t in episodes)
    model = sum(float(t.num_model_tokens) for t in episodes)
    seconds = json.loads((run_dir / "summary.json").read_text())["seconds"]
    parts = ("generate", "update", "sync")  # the training steps' own time
    train_s = sum(float(m.get(f"time/{k}", 0.0)) for m in train for k in parts)
    return {
        "run": run_dir.name,
        "arm": "tree" if (cfg.get("rollout") or {}).get("tree") else "flat",
        "seed": int(cfg.get("seed", 0)),
        "steps": len(steps),
        "episodes": len(episodes),
        "episodes_per_step": len(episodes) / len(steps),
        "gen_tokens_per_step": gen / len(steps),
        "gen_tokens_per_episode": gen / len(episodes),
        "model_tokens_per_episode": model / len(episodes),
        "prefix_reuse": 1.0 - gen / model if model else 0.0,
        "before": float(evals[0]["success"]),
        "after": float(evals[-1]["success"]),
        "gain": float(evals[-1]["success"]) - float(evals[0]["success"]),
        "held_out_tasks": int(evals[0].get("episodes", 0)),
        "train_s": train_s,
        "whole_s": float(seconds["total"]),
    }


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, min, max and (sample) standard deviation; std 0 for one value."""
    return {
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def compare(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per arm each figure's spread over seeds, and the tree/flat ratios of the means.

    Raises:
        SystemExit: An arm has no run.
    """
    by_arm = {a: [r for r in runs if r["arm"] == a] for a in ARMS}
    if not all(by_arm.values()):
        raise SystemExit(f"need runs of both arms, got {sorted(r['arm'] for r in runs)}")
    arms = {a: {k: spread([r[k] for r in rs]) for k, _, _ in ROWS} for a, rs in by_arm.items()}
    f, t = arms["flat"], arms["tree"]

    def ratio(k: str) -> float:
        return t[k]["mean"] / f[k]["mean"] if f[k]["mean"] else float("nan")

    return {
        "seeds": {a: sorted(r["seed"] for r in rs) for a, rs in by_arm.items()},
        "arms": arms,
        "ratios": {
            "gen_tokens_per_episode": ratio("gen_tokens_per_episode"),
            "gen_tokens_per_step": ratio("gen_tokens_per_step"),
            "train_s": ratio("train_s"),
            "whole_s": ratio("whole_s"),
        },
        "gain_diff": t["gain"]["mean"] - f["gain"]["mean"],
    }


def _cell(s: Mapping[str, float], fmt: str, n: int) -> str:
    if n == 1:
        return fmt.format(s["mean"])
    return f"{fmt.format(s['mean'])} [{fmt.format(s['min'])}, {fmt.format(s['max'])}]"


def table(c: Mapping[str, Any]) -> dict[str, Any]:
    """The comparison as results.json's ``table``: one row per figure, arm means with
    [min, max] over seeds, and tree/flat (the difference for success figures)."""
    n = len(c["seeds"]["flat"])
    rows = []
    for k, label, fmt in ROWS:
        f, t = c["arms"]["flat"][k], c["arms"]["tree"][k]
        if k in ("before", "after", "gain", "prefix_reuse"):
            vs = f"{t['mean'] - f['mean']:+.3f} (diff)"
        else:
            vs = f"{t['mean'] / f['mean']:.2f}x" if f["mean"] else "—"
        rows.append([label, _cell(f, fmt, n), _cell(t, fmt, n), vs])
    cols = ["figure", f"flat GRPO (mean [min, max], {n} seeds)", "tree_grpo", "tree / flat"]
    return {"columns": cols, "rows": rows}


def markdown(tab: Mapping[str, Any]) -> str:
    lines = ["| " + " | ".join(tab["columns"]) + " |", "|---|---:|---:|---:|"]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in tab["rows"])])


def verdict(c: Mapping[str, Any]) -> str:
    """One sentence on time: is the comparison at equal wall time, and which arm won."""
    r = c["ratios"]["train_s"]
    pace = "about equal" if abs(r - 1) < 0.1 else ("slower" if r > 1 else "faster")
    who = "tree" if c["gain_diff"] > 0 else "flat" if c["gain_diff"] < 0 else "neither"
    f, t = c["arms"]["flat"]["gain"], c["arms"]["tree"]["gain"]
    overlap = t["min"] <= f["max"] and f["min"] <= t["max"]
    within = "within" if overlap else "beyond"
    return (
        f"Same steps; the tree arm's training steps took {r:.2f}x the flat arm's wall time "
        f"({pace}); held-out gain tree - flat = {c['gain_diff']:+.3f} ({who} ahead, "
        f"{within} the spread over seeds)."
    )


def train(arm: str, seed: int, overrides: Sequence[str], name: str, wrap: Sequence[str]) -> Path:
    """Runs one arm's ``agentrl train`` (under ``wrap``: flock, nice) and returns its run dir."""
    exe = Path(sys.executable).with_name("agentrl")
    cmd = [*wrap, str(exe), "train", "--config", ARMS[arm], f"run_name={name}",
           f"seed={seed}", *overrides]  # fmt: skip
    print(f"=== {arm} seed {seed}: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    print(f"=== {arm} seed {seed}: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)
    if rc != 0:
        raise SystemExit(f"agentrl train ({arm}, seed {seed}) exited with {rc}")
    return ROOT / "runs" / name


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1, one run per arm each")
    p.add_argument("--name", default=None, help="run name prefix (default: a timestamp)")
    p.add_argument("--reuse", action="store_true", help="keep runs of --name that finished")
    p.add_argument("--lock", help="run each agentrl train under `flock PATH`")
    p.add_argument("--nice", type=int, default=0, help="run each agentrl train under nice -n")
    p.add_argument("--quick", action="store_true", help="1 seed, 2 steps, 16 held-out tasks")
    p.add_argument("--from-runs", nargs="+", type=Path, help="recompute from these run dirs")
    p.add_argument("overrides", nargs="*", help="config overrides for both arms, KEY=VALUE")
    a = p.parse_args(argv)
    if a.from_runs:
        dirs = list(a.from_runs)
    else:
        overrides = [*(QUICK if a.quick else []), *a.overrides]
        print(f"the arms differ in: {', '.join(config_diff(overrides))}", flush=True)
        wrap = ["flock", a.lock] if a.lock else []
        wrap += ["nice", "-n", str(a.nice)] if a.nice else []
        prefix = a.name or f"bench-tree-vs-flat-{int(time.time())}"
        dirs = []
        for seed in range(1 if a.quick else a.seeds):
            for arm in ARMS:
                name = f"{prefix}-{arm}-s{seed}"
                done = (ROOT / "runs" / name / "summary.json").is_file()
                dirs.append(ROOT / "runs" / name if a.reuse and done else
                            train(arm, seed, overrides, name, wrap))  # fmt: skip
    runs = [run_figures(d) for d in dirs]
    c = compare(runs)
    tab = table(c)
    print(markdown(tab))
    print(verdict(c))
    f, t = c["arms"]["flat"], c["arms"]["tree"]
    results = [
        report("flat_gain", f["gain"]["mean"], unit="abs"),
        report("tree_gain", t["gain"]["mean"], unit="abs"),
        report("tree_minus_flat_gain", c["gain_diff"], unit="abs"),
        report(
            "tree_vs_flat_gen_tokens_per_leaf",
            c["ratios"]["gen_tokens_per_episode"],
            unit="x",
            better="lower",
        ),
        report("tree_vs_flat_train_time", c["ratios"]["train_s"], unit="x", better="lower"),
        report("tree_vs_flat_whole_time", c["ratios"]["whole_s"], unit="x", better="lower"),
    ]
    if a.quick:  # quick sizes are for iteration, not for results.json
        return 0
    ranges = {"flat_gain": f["gain"], "tree_gain": t["gain"]}
    entry_results = []
    for r in results:
        d = r.to_json()
        if r.name in ranges:
            d["range"] = [ranges[r.name]["min"], ranges[r.name]["max"]]
        entry_results.append(d)
    sizes = yaml.safe_load((dirs[0] / "config.yaml").read_text())
    note = (
        f"{len(c['seeds']['flat'])} seeds, interleaved flat/tree; {sizes['steps']} steps, "
        f"{sizes['rollout']['tasks_per_step']} tasks x {sizes['rollout']['group_size']} "
        f"episodes (leaves) per step, {sizes['eval']['num_tasks']} held-out tasks at "
        f"temperature {sizes['eval']['temperature']}; SmolLM2-135M, retool tiny. " + verdict(c)
    )
    record("tree_vs_flat", {"results": entry_results, "table": tab, "note": note,
                            "comparison": c, "runs": runs})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
