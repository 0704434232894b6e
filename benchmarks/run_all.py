"""Runs every benchmark in turn (``make bench``); each prints its own ratios."""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = [
    "benchmarks.rollout_overhead",
    "benchmarks.delta_tokenization",
    "benchmarks.parsers",
    "benchmarks.async_speedup",
    "benchmarks.async_real",
    "benchmarks.sandbox_local",
    "benchmarks.sandbox_docker",
    "benchmarks.trainer_microbatch",
    "benchmarks.trainer_logprob_memory",
    "benchmarks.inference_overhead",
    "benchmarks.inference_routing",
    "benchmarks.inference_weight_sync",
    "benchmarks.reward_model",
    "benchmarks.gateway",
]


def main() -> int:
    failed = []
    for name in BENCHMARKS:
        print(f"\n=== {name}", flush=True)
        if subprocess.run([sys.executable, "-m", name]).returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
