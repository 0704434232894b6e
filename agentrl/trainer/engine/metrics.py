"""Metric accumulation across micro-batches and workers, and phase timers."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
import torch.distributed as dist

from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.engine.batch import Batch
from agentrl.types import Trajectory

__all__ = [
    "Accumulator",
    "PhaseTimer",
    "batch_metrics",
    "correction_metrics",
    "dist_active",
    "reward_metrics",
]


def dist_active() -> bool:
    """Whether a torch.distributed process group with more than one worker is up."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class Accumulator:
    """Sums (with counts), minima and maxima gathered over micro-batches, then reduced."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, float] = defaultdict(float)
        self.mins: dict[str, float] = {}
        self.maxs: dict[str, float] = {}

    def add(self, name: str, total: float, count: float) -> None:
        """Adds a sum over ``count`` items; the result is total/count."""
        self.sums[name] += float(total)
        self.counts[name] += float(count)

    def extreme(self, name: str, lo: float, hi: float) -> None:
        """Tracks the min of ``lo`` under name/min and the max of ``hi`` under name/max."""
        self.mins[name] = min(self.mins.get(name, math.inf), float(lo))
        self.maxs[name] = max(self.maxs.get(name, -math.inf), float(hi))

    def reduce(self) -> None:
        """All-reduces across workers (sum, min, max), in a fixed key order."""
        if not dist_active():
            return
        # Workers may have seen different keys (a worker with only padding micro-batches).
        seen: list[tuple[list[str], list[str]] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(seen, (list(self.sums), list(self.mins)))
        for item in seen:
            assert item is not None
            for k in item[0]:
                self.sums[k] += 0.0
                self.counts[k] += 0.0
            for k in item[1]:
                self.mins.setdefault(k, math.inf)
                self.maxs.setdefault(k, -math.inf)
        keys = sorted(self.sums)
        t = torch.tensor([[self.sums[k], self.counts[k]] for k in keys], dtype=torch.float64)
        if t.numel():
            dist.all_reduce(t)
            for i, k in enumerate(keys):
                self.sums[k], self.counts[k] = float(t[i, 0]), float(t[i, 1])
        ekeys = sorted(self.mins)
        if ekeys:
            lo = torch.tensor([self.mins[k] for k in ekeys], dtype=torch.float64)
            hi = torch.tensor([self.maxs[k] for k in ekeys], dtype=torch.float64)
            dist.all_reduce(lo, op=dist.ReduceOp.MIN)
            dist.all_reduce(hi, op=dist.ReduceOp.MAX)
            for i, k in enumerate(ekeys):
                self.mins[k], self.maxs[k] = float(lo[i]), float(hi[i])

    def result(self) -> dict[str, float]:
        out = {k: (self.sums[k] / self.counts[k] if self.counts[k] else 0.0) for k in self.sums}
        for k in self.mins:
            out[f"{k}_min"] = self.mins[k]
            out[f"{k}_max"] = self.maxs[k]
        return out


class PhaseTimer:
    """Wall-clock seconds per named phase: ``with timer("update"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.seconds[phase] += time.perf_counter() - t0

    def result(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.seconds.items()}


def correction_metrics(m: dict[str, float]) -> dict[str, float]:
    """Fractions from the sums of ``compute_correction``."""
    out = {
        "correction/masked_token_frac": m["masked_tokens"] / max(m["tokens"], 1.0),
        "correction/rejected_seq_frac": m["rejected_seqs"] / max(m["seqs"], 1.0),
    }
    if "veto_seqs" in m:
        out["correction/veto_seq_frac"] = m["veto_seqs"] / max(m["seqs"], 1.0)
    if "is_weight_n" in m:
        out["correction/is_weight_mean"] = m["is_weight_sum"] / max(m["is_weight_n"], 1.0)
    return out


def reward_metrics(trajs: Sequence[Trajectory], cfg: TrainerConfig) -> dict[str, float]:
    """Raw reward stats and the fraction of groups with zero reward std (before filtering)."""
    r = np.asarray([t.reward for t in trajs], dtype=np.float64)
    groups: dict[str, list[float]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(float(t.reward))
    multi = [g for g in groups.values() if len(g) > 1]
    zero = sum(max(g) - min(g) <= 1e-12 for g in multi)
    trunc = [str(t.stop_reason) in cfg.shaping.truncated_reasons for t in trajs]
    return {
        "reward/mean": float(r.mean()) if r.size else 0.0,
        "reward/std": float(r.std()) if r.size else 0.0,
        "reward/zero_std_group_frac": zero / len(multi) if multi else 0.0,
        "response/truncated_frac": float(np.mean(trunc)) if trunc else 0.0,
    }


def batch_metrics(
    batch: Batch,
    adv: torch.Tensor,
    ret: torch.Tensor,
    values: torch.Tensor | None,
    entropy: torch.Tensor | None,
    weight_version: int | None,
) -> dict[str, float]:
    """Scores, lengths, advantages, values, entropy and staleness of a batch."""
    mask = batch.mask_BR
    m = mask > 0
    n = mask.sum().clamp(min=1)
    resp = batch.resp_len_B
    out = {
        "score/mean": float(batch.scores_B.mean()),
        "score/std": float(batch.scores_B.std()) if batch.size > 1 else 0.0,
        "response/length_mean": float(resp.mean()),
        "response/length_max": float(resp.max()),
        "episode/length_mean": float(batch.lengths_B.float().mean()),
        "adv/mean": float((adv * mask).sum() / n),
        "adv/min": float(adv[m].min()) if m.any() else 0.0,
        "adv/max": float(adv[m].max()) if m.any() else 0.0,
        "returns/mean": float((ret * mask).sum() / n),
        "batch/episodes": float(batch.size),
        "batch/model_tokens": float(mask.sum()),
    }
    if values is not None:
        out["critic/values_mean"] = float((values * mask).sum() / n)
    if entropy is not None:
        out["entropy/old"] = float((entropy * mask).sum() / n)
    v = batch.versions_BR[m & (batch.versions_BR >= 0)]
    if v.numel():
        newest = weight_version if weight_version is not None else int(v.max())
        lag = (newest - v).float()
        out.update(
            {
                "staleness/mean": float(lag.mean()),
                "staleness/max": float(lag.max()),
                "staleness/min": float(lag.min()),
            }
        )
    return out


# Dense bf16 tensor-core peak FLOP/s by GPU name (vendor datasheets, no sparsity).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}


def train_flops_per_token(
    params: int, layers: int, heads: int, head_dim: int, seq_len: float
) -> float:
    """Model FLOPs of one trained token: 6·N + 12·n·heads·head_dim·L (PaLM, Chowdhery et
    al. 2022, appendix B); recomputation by gradient checkpointing is not counted (MFU, not
    HFU). ``seq_len`` is the mean episode length."""
    return 6.0 * params + 12.0 * layers * heads * head_dim * seq_len


def mfu(tokens_per_s: float, flops_per_token: float, device_name: str) -> float | None:
    """Model FLOPs utilization against the device's bf16 peak (None for an unknown device)."""
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in device_name), None)
    return None if peak is None else tokens_per_s * flops_per_token / peak
