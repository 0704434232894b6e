"""What a person watching a run sees: a line per step, wandb (offline by default), the curve.

On a terminal the step lines scroll above a rich progress bar (step, health metrics, ETA);
elsewhere (a pipe, a log file, CI) each step is one full-width line, never wrapped.
wandb itself prints nothing; at the end one line points to its files (offline) or its run
page (online).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentrl.reporting.discards import describe_counts, discard_counts, eval_discards

__all__ = ["ProgressLog", "discard_part", "plot_curve", "wandb_pointer"]

# (metric key, label, format) of the health metrics shown each step, when present.
_SHOWN = (
    ("reward/mean", "reward", "{:.3f}"),
    ("reward/zero_std_group_frac", "0-std groups", "{:.2f}"),
    ("actor/entropy", "entropy", "{:.3f}"),
    ("kl/ref_kl", "kl", "{:.4f}"),
    ("actor/clip_high_frac", "clip+", "{:.3f}"),
    ("actor/clip_low_frac", "clip-", "{:.3f}"),
    ("actor/grad_norm", "|g|", "{:.2f}"),
    ("response/length_mean", "len", "{:.0f}"),
    ("response/truncated_frac", "trunc", "{:.2f}"),
    ("staleness/max", "stale", "{:.0f}"),
)


def discard_part(metrics: Mapping[str, float]) -> str | None:
    """``discarded D/N (reason n, …)`` of a step that discarded episodes, else None."""
    d, n = metrics.get("episodes/discarded"), metrics.get("episodes/generated")
    if not d or n is None or not math.isfinite(float(d)):
        return None
    why = describe_counts(discard_counts(metrics))
    return f"discarded {d:.0f}/{n:.0f}" + (f" ({why})" if why else "")


class ProgressLog:
    """Prints one line per step (step, discarded episodes, health metrics, throughput, ETA)
    and logs to wandb.

    Args:
        total_steps: Steps of the run (for the ETA).
        run_dir: Where wandb's offline files go.
        wandb_mode: "offline", "online" or "disabled".
        config: The resolved config, recorded by wandb.
        console: Where lines go.
    """

    def __init__(
        self,
        total_steps: int,
        run_dir: Path,
        *,
        wandb_mode: Literal["offline", "online", "disabled"] = "offline",
        config: Mapping[str, Any] | None = None,
        console: Console | None = None,
    ) -> None:
        self.total = total_steps
        self.console = console or Console()
        self.t0 = time.monotonic()
        self.first_step: int | None = None
        self._wandb: Any = None
        self._bar: Progress | None = None
        if self.console.is_terminal and not self.console.is_dumb_terminal:
            self._bar = Progress(
                TextColumn("step"),
                MofNCompleteColumn(),
                BarColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[eta]}"),
                console=self.console,
            )
            self._bar_task = self._bar.add_task("train", total=total_steps, eta="")
        if wandb_mode != "disabled":
            try:
                import wandb
            except ImportError:
                self.console.print("wandb is not installed: metrics go to metrics.jsonl only")
            else:
                # Nor its advert for Weave when an LLM client (openai, ...) is imported; a
                # user's own setting of the variable wins.
                os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")
                self._wandb = wandb.init(
                    mode=wandb_mode,
                    dir=str(run_dir),
                    name=run_dir.name,
                    config=dict(config or {}),
                    reinit="finish_previous",
                    # wandb prints nothing: no header, no run history/summary, no sync hint,
                    # no log paths. Its files are written as before (run records, logs);
                    # close() prints the one line that points to them.
                    settings=wandb.Settings(silent=True),
                )

    def step(self, step: int, metrics: Mapping[str, float]) -> None:
        """Shows and records one step's metrics."""
        if self.first_step is None:
            self.first_step, self.t0 = step - 1, self.t0
        done = step - (self.first_step or 0)
        elapsed = time.monotonic() - self.t0
        eta = elapsed / max(done, 1) * max(self.total - step, 0)
        parts = [f"step {step}/{self.total}"]
        discarded = discard_part(metrics)
        if discarded:
            parts.append(discarded)
        seen: set[str] = set()
        for key, label, fmt in _SHOWN:
            v = metrics.get(key)
            if v is not None and label not in seen and math.isfinite(float(v)):
                parts.append(f"{label} {fmt.format(v)}")
                seen.add(label)
        tokens = metrics.get("perf/tokens_per_s")
        if tokens:
            parts.append(f"{tokens:.0f} tok/s")
        parts.append(f"eta {eta / 60:.1f} min")
        self.console.print(" | ".join(parts), markup=False, soft_wrap=True)  # never wrapped
        if self._bar is not None:
            self._bar.update(self._bar_task, completed=step, eta=f"eta {eta / 60:.1f} min")
            self._bar.start()  # idempotent; lines printed meanwhile scroll above the bar
        if self._wandb is not None:
            self._wandb.log(dict(metrics), step=step)

    def eval(self, step: int, metrics: Mapping[str, float]) -> None:
        """Records an evaluation."""
        if self._wandb is not None:
            self._wandb.log({f"eval/{k}": v for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        """Stops the progress bar, finishes the wandb run and prints the one line that
        points to it (:func:`wandb_pointer`) (idempotent)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self._wandb is not None:
            run, self._wandb = self._wandb, None
            line = wandb_pointer(run)
            run.finish()
            if line:
                self.console.print(line, markup=False, soft_wrap=True)  # a path, never wrapped


def wandb_pointer(run: Any) -> str | None:
    """The one line a run prints about its wandb run: where an offline run's files are and
    how to upload them, or an online run's URL."""
    if run.offline:
        return f"wandb: offline run files in {run.sync_dir}; upload with: wandb sync {run.sync_dir}"
    return f"wandb: run at {run.url}" if run.url else None


def _measured(res: Mapping[str, Any]) -> bool:
    d, n, _ = eval_discards(res)
    return not d >= n > 0


def plot_curve(lines: Iterable[Mapping[str, Any]], path: Path) -> Path:
    """Draws training reward and eval success against step into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = list(lines)
    train = [(m["step"], m.get("reward/mean")) for m in lines if m.get("kind") == "train"]
    evals = [
        (m["step"], m["success"])
        for m in lines
        if m.get("kind") == "eval" and _measured(m)  # not when every episode was discarded
    ]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    pts = [(s, r) for s, r in train if r is not None]
    if pts:
        ax.plot(*zip(*pts, strict=True), label="train reward (mean)", color="tab:blue")
    if evals:
        ax.plot(*zip(*evals, strict=True), "o-", label="held-out success", color="tab:orange")
    ax.set_xlabel("step")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
