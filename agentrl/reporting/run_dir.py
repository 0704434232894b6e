"""The run directory: resolved config, metrics, trajectories, checkpoints, final model.

Layout::

    RUN_DIR/
      config.yaml            the resolved config (every field)
      metrics.jsonl          one JSON object per step (and per eval)
      trajectories/step_000001.parquet   every episode the step trained on, columnar
      discarded/step_000001.parquet      the step's episodes dropped for their own sake
                                         (agent/env/LLM errors …): reason and traceback
      discarded/eval_000000.parquet      the same for the evaluation at that step
      checkpoints/step_000010/           trainer + run state (atomic)
      final_model/           a plain HF model directory
      curve.png              reward and eval success vs step
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agentrl.types import Message, StopReason, Trajectory, TurnSpan

__all__ = ["RunDir", "read_discarded", "read_trajectories", "write_trajectories"]

DISCARD_REASON = "discard_reason"
"""The extra column of a ``discarded/`` file: why the episode was not trained on (its stop
reason, e.g. ``agent_error``, or ``no_model_tokens``); the traceback is in ``error``."""

_SCHEMA = pa.schema(
    [
        ("episode_id", pa.string()),
        ("task_id", pa.string()),
        ("group_id", pa.string()),
        ("token_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("rollout_logprobs", pa.list_(pa.float32())),
        ("weight_versions", pa.list_(pa.int32())),
        ("prompt_length", pa.int32()),
        ("spans", pa.string()),
        ("reward", pa.float64()),
        ("stop_reason", pa.string()),
        ("num_turns", pa.int32()),
        ("messages", pa.string()),
        ("metrics", pa.string()),
        ("info", pa.string()),
        ("error", pa.string()),
        ("strategy", pa.string()),
        ("sample_starts", pa.list_(pa.int32())),
        ("tool_calls", pa.string()),
    ]
)

# Columns added after files were first written, with the value an old file reads as.
_LATER_COLUMNS: dict[str, Any] = {
    "strategy": "as_sampled",
    "sample_starts": [],
    "tool_calls": "[]",
}


def _json(x: Any) -> str:
    return json.dumps(x, default=str, separators=(",", ":"))


def _span_row(s: TurnSpan) -> list[Any]:
    """A span as a JSON row: [start, end, kind, reward], and its role when it has one."""
    row: list[Any] = [s.start, s.end, s.kind, s.reward]
    return [*row, s.role] if s.role else row


def write_trajectories(
    trajs: Sequence[Trajectory],
    path: str | Path,
    *,
    discard_reasons: Sequence[str] | None = None,
) -> None:
    """Writes trajectories to a parquet file (zstd), one row per episode.

    Every Trajectory field is stored; ``rollout_logprobs`` as float32 (about 7
    significant digits), the rest exactly. ``discard_reasons`` (one per episode) adds
    the :data:`DISCARD_REASON` column of a ``discarded/`` file.
    """
    cols: dict[str, list[Any]] = {f.name: [] for f in _SCHEMA}
    for t in trajs:
        cols["episode_id"].append(t.episode_id)
        cols["task_id"].append(t.task_id)
        cols["group_id"].append(t.group_id)
        cols["token_ids"].append(t.token_ids)
        cols["loss_mask"].append(t.loss_mask)
        cols["rollout_logprobs"].append(t.rollout_logprobs)
        cols["weight_versions"].append(t.weight_versions)
        cols["prompt_length"].append(t.prompt_length)
        cols["spans"].append(_json([_span_row(s) for s in t.spans]))
        cols["reward"].append(t.reward)
        cols["stop_reason"].append(str(t.stop_reason))
        cols["num_turns"].append(t.num_turns)
        cols["messages"].append(_json([m.to_dict() for m in t.messages]))
        cols["metrics"].append(_json(t.metrics))
        cols["info"].append(_json(t.info))
        cols["error"].append(t.error)
        cols["strategy"].append(t.strategy)
        cols["sample_starts"].append(t.sample_starts)
        cols["tool_calls"].append(_json(t.tool_calls))
    schema = _SCHEMA
    if discard_reasons is not None:
        if len(discard_reasons) != len(trajs):
            raise ValueError(f"{len(discard_reasons)} discard reasons for {len(trajs)} episodes")
        cols[DISCARD_REASON] = list(discard_reasons)
        schema = schema.append(pa.field(DISCARD_REASON, pa.string()))
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    pq.write_table(pa.table(cols, schema=schema), tmp, compression="zstd")
    tmp.replace(path)


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """Reads a file written by :func:`write_trajectories` back into Trajectory objects.

    Files written before a column existed read that field as its default
    (``strategy="as_sampled"``, no ``sample_starts``: one sample per episode).
    """
    rows = pq.read_table(path).to_pylist()
    out = []
    for r in rows:
        r = {**_LATER_COLUMNS, **r}
        out.append(
            Trajectory(
                task_id=r["task_id"],
                group_id=r["group_id"],
                episode_id=r["episode_id"],
                token_ids=list(r["token_ids"]),
                loss_mask=list(r["loss_mask"]),
                rollout_logprobs=list(r["rollout_logprobs"]),
                weight_versions=list(r["weight_versions"]),
                prompt_length=r["prompt_length"],
                spans=[TurnSpan(*row) for row in json.loads(r["spans"])],
                reward=r["reward"],
                stop_reason=StopReason(r["stop_reason"]),
                messages=[Message.from_dict(m) for m in json.loads(r["messages"])],
                num_turns=r["num_turns"],
                metrics=json.loads(r["metrics"]),
                info=json.loads(r["info"]),
                error=r["error"],
                strategy=r["strategy"],
                sample_starts=list(r["sample_starts"]),
                tool_calls=json.loads(r["tool_calls"]),
            )
        )
    return out


def read_discarded(path: str | Path) -> list[tuple[str, Trajectory]]:
    """Reads a ``discarded/`` file: (reason, episode) per row, the traceback in ``error``."""
    reasons = pq.read_table(path, columns=[DISCARD_REASON]).column(DISCARD_REASON).to_pylist()
    return list(zip(reasons, read_trajectories(path), strict=True))


class RunDir:
    """Owns one run's directory.

    Args:
        path: The directory (created if missing).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        for sub in ("trajectories", "checkpoints"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def final_model(self) -> Path:
        return self.path / "final_model"

    def log(self, step: int, metrics: Mapping[str, Any], *, kind: str = "train") -> None:
        """Appends one line to metrics.jsonl (non-finite floats written as null)."""
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in metrics.items()
        }
        line = _json({"step": step, "kind": kind, "time": time.time(), **clean})
        with self.metrics_file.open("a") as f:
            f.write(line + "\n")

    def metrics(self) -> Iterator[dict[str, Any]]:
        """The lines of metrics.jsonl."""
        if self.metrics_file.exists():
            for line in self.metrics_file.read_text().splitlines():
                if line.strip():
                    yield json.loads(line)

    def save_trajectories(self, step: int, trajs: Sequence[Trajectory]) -> Path:
        path = self.path / "trajectories" / f"step_{step:06d}.parquet"
        write_trajectories(trajs, path)
        return path

    @property
    def discarded_dir(self) -> Path:
        """Where discarded episodes go (created with the first one)."""
        return self.path / "discarded"

    def discarded_file(self, step: int, *, evaluation: bool = False) -> Path:
        """``discarded/step_N.parquet`` (a training step) or ``discarded/eval_N.parquet``."""
        return self.discarded_dir / f"{'eval' if evaluation else 'step'}_{step:06d}.parquet"

    def save_discarded(
        self, step: int, items: Sequence[tuple[str, Trajectory]], *, evaluation: bool = False
    ) -> Path | None:
        """Writes a step's (or an evaluation's) discarded episodes with their reasons.

        Returns the file, or None when there are none; then an older file of that step
        (a step logged again after a resume) is removed, so the directory describes
        the steps as last run.
        """
        path = self.discarded_file(step, evaluation=evaluation)
        if not items:
            path.unlink(missing_ok=True)
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        write_trajectories([t for _, t in items], path, discard_reasons=[r for r, _ in items])
        return path
