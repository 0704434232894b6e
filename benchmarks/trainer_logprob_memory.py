"""Peak memory of the chunked logprob path vs the naive full log-softmax.

Both compute log π(target) and the entropy of N tokens from hidden states through a
V-way lm head, then backpropagate; each runs in a fresh subprocess and reports its
peak resident memory above the inputs (Linux: VmHWM after resetting it through
/proc/self/clear_refs) or, on CUDA, torch.cuda.max_memory_allocated.

    python -m benchmarks.trainer_logprob_memory [--tokens 8192 --vocab 32768 --hidden 512]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from benchmarks.report import report


def _vm_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure(mode: str, tokens: int, vocab: int, hidden: int, chunk: int, device: str) -> dict:
    from agentrl.trainer.engine.actor import chunked_logprobs

    torch.manual_seed(0)
    dev = torch.device(device)
    head = torch.nn.Linear(hidden, vocab, bias=False).to(dev)
    h = torch.randn(tokens, hidden, device=dev, requires_grad=True)
    tgt = torch.randint(0, vocab, (tokens,), device=dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
        base = _vm_kib("VmRSS:") * 1024
    t0 = time.perf_counter()
    if mode == "naive":
        logp_NV = torch.log_softmax(head(h).float(), dim=-1)
        lp = logp_NV.gather(-1, tgt[:, None]).squeeze(-1)
        ent = -(logp_NV.exp() * logp_NV).sum(-1)
    else:
        lp, ent = chunked_logprobs(h, head, tgt, chunk=chunk)
    (lp.sum() + 0.01 * ent.sum()).backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = _vm_kib("VmHWM:") * 1024 - base
    return {"mode": mode, "peak_bytes": peak, "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        torch.set_num_threads(1)
        print(json.dumps(measure(a.child, a.tokens, a.vocab, a.hidden, a.chunk, a.device)))
        return
    full_logits = a.tokens * a.vocab * 4
    print(
        f"N={a.tokens} tokens, V={a.vocab}, H={a.hidden}, chunk={a.chunk}, device={a.device}; "
        f"one fp32 (N, V) tensor = {full_logits / 2**20:.0f} MiB"
    )
    res = {}
    for mode in ("naive", "chunked"):
        cmd = [sys.executable, "-m", "benchmarks.trainer_logprob_memory", "--child", mode]
        cmd += ["--tokens", str(a.tokens), "--vocab", str(a.vocab), "--hidden", str(a.hidden)]
        cmd += ["--chunk", str(a.chunk), "--device", a.device]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        res[mode] = json.loads(out.strip().splitlines()[-1])
        r = res[mode]
        print(f"{mode:8s} peak {r['peak_bytes'] / 2**20:8.0f} MiB   {r['seconds']:.2f} s")
    ratio = res["naive"]["peak_bytes"] / max(res["chunked"]["peak_bytes"], 1)
    print(f"RATIO naive/chunked peak memory = {ratio:.1f}x")
    chunked_mib = res["chunked"]["peak_bytes"] / 2**20
    report("chunked_peak_mib", chunked_mib, unit="MiB", better="lower")
    report("naive_over_chunked_peak_memory", ratio, unit="x", baseline=chunked_mib)


if __name__ == "__main__":
    main()
