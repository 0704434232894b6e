"""LoRA against full fine-tuning on the SmolLM2 retool job, same seed and steps, one run.

Two ``agentrl train`` runs, each a subprocess of its own: configs/retool.yaml (full
fine-tuning, lr 2e-5) and configs/retool-smollm2-lora.yaml (rank 16 on every linear layer
of the decoder, lr 4e-4, the adapter hot-loaded by the servers), both with
``trainer.worker=process`` (the trainer in a child on jemalloc) and the same held-out
problems before and after. From each run's metrics: trainer update time per step, weight
sync time and bytes per step, whole-step wall time, peak and between-step trainer RSS, and
held-out success. Then the serving cost of an adapter: one vLLM server with
``--enable-lora`` generates the same batch (8 prompts x 64 tokens, greedy, EOS ignored)
from the base model and through the LoRA run's adapter (hot-loaded), tokens/s of each.

Targets (issue #42): sync bytes = the adapter's (about 1/27 of the full model's here),
sync time <= 1/10 of full, peak trainer RSS <= 0.8x, held-out gain within 0.1 of full
fine-tuning.

Run: ``python -m benchmarks.lora_vs_full [--steps N] [--seed S] [--eval-tasks N] [--table]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.report import record, report

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"
CONFIGS = {"full": "configs/retool.yaml", "lora": "configs/retool-smollm2-lora.yaml"}


def run_figures(lines: Sequence[Mapping[str, Any]], wall_s: float) -> dict[str, float]:
    """One run's row from its metrics lines (``kind`` train and eval) and its wall time."""
    train = [m for m in lines if m.get("kind") == "train"]
    evals = sorted((m for m in lines if m.get("kind") == "eval"), key=lambda m: m["step"])
    if not train or len(evals) < 2:
        raise SystemExit("a run wrote no train steps or no before/after evaluation")

    def mean(key: str) -> float:
        return statistics.fmean(float(m.get(key, 0.0)) for m in train)

    return {
        "wall_s": wall_s,
        "update_s": mean("time/update"),
        "sync_s": mean("time/sync"),
        "sync_mb": mean("sync/bytes") / 1e6,
        "step_s": mean("time/generate") + mean("time/train") + mean("time/sync"),
        "peak_rss_gb": max(float(m.get("perf/peak_rss_gb", 0.0)) for m in train),
        "between_rss_gb": max(float(m.get("perf/rss_between_steps_gb", 0.0)) for m in train),
        "before": float(evals[0]["success"]),
        "after": float(evals[-1]["success"]),
        "gain": float(evals[-1]["success"]) - float(evals[0]["success"]),
    }


COLUMNS = (
    ("wall_s", "whole run s", "{:.0f}"),
    ("step_s", "step s", "{:.1f}"),
    ("update_s", "update s/step", "{:.1f}"),
    ("sync_s", "sync s", "{:.2f}"),
    ("sync_mb", "sync MB", "{:.1f}"),
    ("peak_rss_gb", "peak trainer RSS GB", "{:.2f}"),
    ("between_rss_gb", "between-step RSS GB", "{:.2f}"),
    ("before", "held-out before", "{:.3f}"),
    ("after", "held-out after", "{:.3f}"),
)


def table(entry: Mapping[str, Any]) -> str:
    """Markdown: a row per variant, the ratios LoRA/full, then serving tokens/s."""
    out = ["| | " + " | ".join(c[1] for c in COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    for name in ("full", "lora"):
        row = entry["rows"][name]
        out.append(f"| {name} | " + " | ".join(f.format(row[k]) for k, _, f in COLUMNS) + " |")
    r = entry["ratios"]
    out.append(
        "| lora/full | "
        + " | ".join("" if k in ("before", "after") else f"{r[k]:.3f}x" for k, _, _ in COLUMNS)
        + " |"
    )
    s = entry.get("serving")
    if s:
        out += [
            "",
            "| serving (8 x 64 tokens, greedy) | tokens/s |",
            "|---|---:|",
            f"| base model | {s['base_tok_s']:.0f} |",
            f"| through the adapter | {s['adapter_tok_s']:.0f} |",
            f"| adapter/base | {s['adapter_tok_s'] / s['base_tok_s']:.2f}x |",
        ]
    return "\n".join(out)


def run_one(name: str, a: argparse.Namespace, out_dir: Path) -> tuple[dict[str, float], Path]:
    """``agentrl train`` with the variant's preset in a subprocess; its row and run dir."""
    cmd = [
        sys.executable, "-m", "agentrl.cli", "train", "--config", CONFIGS[name],
        f"output_dir={out_dir}", f"run_name={name}", f"steps={a.steps}", f"seed={a.seed}",
        f"eval.num_tasks={a.eval_tasks}", "trainer.worker=process", "wandb=disabled",
        *a.set,
    ]  # fmt: skip
    t0 = time.monotonic()
    code = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
    wall = time.monotonic() - t0
    if code != 0:
        raise SystemExit(f"the {name} run failed (exit {code})")
    run = out_dir / name
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    row = run_figures(lines, wall)
    print(f"{name}:", {k: round(v, 3) for k, v in row.items()}, flush=True)
    return row, run


async def _tokens_per_s(url: str, model: str, prompts: list[list[int]], n: int) -> float:
    import httpx

    body = {"model": model, "max_tokens": n, "temperature": 0.0, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=600) as http:

        async def one(p: list[int]) -> None:
            r = await http.post(f"{url}/v1/completions", json={**body, "prompt": p})
            r.raise_for_status()

        await one(prompts[0])  # warm-up
        t0 = time.monotonic()
        await asyncio.gather(*(one(p) for p in prompts))
        return len(prompts) * n / (time.monotonic() - t0)


async def serving(model_dir: str, adapter_dir: Path, rank: int) -> dict[str, float]:
    """Tokens/s of one LoRA-enabled server: the base model, then the hot-loaded adapter."""
    import httpx

    from agentrl.inference.server import ServerConfig, VLLMServer

    server = VLLMServer(
        ServerConfig(
            model=model_dir,
            dtype="float32",
            kv_cache_gib=1.0,
            max_model_len=2048,
            extra_args=("--enforce-eager",),
            lora_max_rank=rank,
        )
    )
    await server.start()
    try:
        url = server.url
        async with httpx.AsyncClient(timeout=120) as http:
            r = await http.post(
                f"{url}/v1/load_lora_adapter",
                json={"lora_name": "bench", "lora_path": str(adapter_dir)},
            )
            r.raise_for_status()
        prompts = [[1 + (7 * i + j) % 500 for j in range(64)] for i in range(8)]
        base = await _tokens_per_s(url, model_dir, prompts, 64)
        lora = await _tokens_per_s(url, "bench", prompts, 64)
    finally:
        await server.stop()
    return {"base_tok_s": base, "adapter_tok_s": lora}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-tasks", type=int, default=48)
    p.add_argument("--quick", action="store_true", help="1 step, 8 held-out problems, not saved")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for both runs")  # fmt: skip
    p.add_argument("--table", action="store_true", help="print the table of results.json")
    a = p.parse_args()
    if a.table:
        print(table(json.loads(RESULTS.read_text())["lora_vs_full"]))
        return
    if a.quick:
        a.steps, a.eval_tasks = 1, 8
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lora-vs-full-") as tmp:
        rows, runs = {}, {}
        for name in ("full", "lora"):
            rows[name], runs[name] = run_one(name, a, Path(tmp))
        adapter = Path(tmp) / "adapter"
        subprocess.run(
            [sys.executable, "-m", "agentrl.cli", "export", str(runs["lora"]), "--adapter",
             "--out", str(adapter)],
            cwd=ROOT, check=True,
        )  # fmt: skip
        base = json.loads((adapter / "adapter_config.json").read_text())
        serve = asyncio.run(serving(base["base_model_name_or_path"], adapter, 16))
    rat = {k: rows["lora"][k] / rows["full"][k] if rows["full"][k] else float("nan")
           for k in rows["full"]}  # fmt: skip
    entry = {
        "steps": a.steps, "seed": a.seed, "eval_tasks": a.eval_tasks, "rows": rows,
        "ratios": rat, "serving": serve, "benchmark_s": time.monotonic() - t0,
    }  # fmt: skip
    if not a.quick:
        record("lora_vs_full", entry)
    print(table(entry))
    print(f"benchmark {entry['benchmark_s']:.0f} s")
    full, lora = rows["full"], rows["lora"]
    report("sync_bytes_lora_vs_full", rat["sync_mb"], target=1 / 27, unit="x", better="lower",
           baseline=full["sync_mb"])  # fmt: skip
    report("sync_time_lora_vs_full", rat["sync_s"], target=0.1, unit="x", better="lower",
           baseline=full["sync_s"])  # fmt: skip
    report("peak_rss_lora_vs_full", rat["peak_rss_gb"], target=0.8, unit="x", better="lower",
           baseline=full["peak_rss_gb"])  # fmt: skip
    report("heldout_gain_lora_minus_full", lora["gain"] - full["gain"], target=-0.1,
           baseline=full["gain"])  # fmt: skip
    report("serving_adapter_vs_base", serve["adapter_tok_s"] / serve["base_tok_s"], unit="x",
           baseline=serve["base_tok_s"])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
