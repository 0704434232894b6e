"""What the inspector reads from a run directory: steps, episode summaries, episodes, metrics.

Only the files a request needs are read: a step's episode list reads that step's
small columns (ids, reward, stop reason, loss mask), cached until the file changes;
one episode reads its step's file once (the last few files stay cached).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from agentrl.reporting.dashboard import RULES, finite_number
from agentrl.reporting.run_dir import read_trajectories
from agentrl.types import Trajectory

__all__ = [
    "EpisodeFilter",
    "NotARunDirError",
    "RunData",
    "dashboard_keys",
    "metric_series",
    "numeric_keys",
]

_SUMMARY_COLUMNS = ("episode_id", "task_id", "group_id", "reward", "stop_reason", "num_turns")


class NotARunDirError(ValueError):
    """The path is not a run directory (the message says why)."""


def dashboard_keys() -> list[str]:
    """The metrics the dashboard's rules read, in dashboard order, then eval ``success``."""
    out: list[str] = []
    for rule in RULES:
        out += [k for k in rule.keys if k not in out]
    return out


@dataclass(frozen=True)
class EpisodeFilter:
    """Which episodes a listing keeps.

    Attributes:
        step: Only this step (None: every step, newest first).
        min_reward: Keep rewards ≥ this.
        max_reward: Keep rewards ≤ this.
        stops: Keep these stop reasons (empty: all).
        task: Keep task ids containing this text (case-insensitive; empty: all).
    """

    step: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    stops: tuple[str, ...] = ()
    task: str = ""

    def keep(self, s: dict[str, Any]) -> bool:
        r = s["reward"]
        return (
            (self.min_reward is None or r >= self.min_reward)
            and (self.max_reward is None or r <= self.max_reward)
            and (not self.stops or s["stop_reason"] in self.stops)
            and (not self.task or self.task.lower() in s["task_id"].lower())
        )


def _file_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path), st.st_mtime_ns, st.st_size


class RunData:
    """Read-only view of one run directory.

    Args:
        path: The run directory.

    Raises:
        NotARunDirError: ``path`` is missing, not a directory, or has none of
            config.yaml, metrics.jsonl and trajectories/.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise NotARunDirError(f"{self.path} does not exist")
        if not self.path.is_dir():
            raise NotARunDirError(f"{self.path} is not a directory")
        marks = ("config.yaml", "metrics.jsonl", "trajectories")
        if not any((self.path / m).exists() for m in marks):
            raise NotARunDirError(
                f"{self.path} is not a run directory (it has no config.yaml, metrics.jsonl "
                "or trajectories/; give the directory `agentrl train` printed)"
            )
        self._lock = threading.Lock()
        self._summaries: dict[int, tuple[tuple[str, int, int], list[dict[str, Any]]]] = {}
        self._episodes: OrderedDict[tuple[str, int, int], list[Trajectory]] = OrderedDict()

    # ------------------------------------------------------------------ steps

    def step_file(self, step: int) -> Path:
        return self.path / "trajectories" / f"step_{step:06d}.parquet"

    def steps(self) -> list[int]:
        """Steps with a trajectory file, ascending."""
        out = []
        for f in (self.path / "trajectories").glob("step_*.parquet"):
            try:
                out.append(int(f.stem.removeprefix("step_")))
            except ValueError:
                continue
        return sorted(out)

    def num_episodes(self, step: int) -> int:
        """Episodes in a step's file (read from the parquet footer only)."""
        return int(pq.ParquetFile(self.step_file(step)).metadata.num_rows)

    # ---------------------------------------------------------------- episodes

    def summaries(self, step: int) -> list[dict[str, Any]]:
        """One small dict per episode of ``step`` (no token lists).

        Raises:
            KeyError: No trajectory file for ``step``.
        """
        path = self.step_file(step)
        if not path.is_file():
            raise KeyError(step)
        key = _file_key(path)
        with self._lock:
            hit = self._summaries.get(step)
        if hit is not None and hit[0] == key:
            return hit[1]
        names = set(pq.ParquetFile(path).schema_arrow.names)
        cols = [c for c in (*_SUMMARY_COLUMNS, "strategy", "error", "loss_mask") if c in names]
        table = pq.read_table(path, columns=cols)
        mask = table.column("loss_mask").combine_chunks()
        offsets = mask.offsets.to_numpy().astype(np.int64)
        csum = np.concatenate([[0], np.cumsum(mask.values.to_numpy(zero_copy_only=False))])
        model_tokens = csum[offsets[1:]] - csum[offsets[:-1]]
        lengths = offsets[1:] - offsets[:-1]
        rows = table.drop_columns(["loss_mask"]).to_pylist()
        out = []
        for i, r in enumerate(rows):
            out.append(
                {
                    "id": f"{step}-{i}",
                    "step": step,
                    "index": i,
                    "episode_id": r["episode_id"],
                    "task_id": r["task_id"],
                    "group_id": r["group_id"],
                    "reward": r["reward"],
                    "stop_reason": r["stop_reason"],
                    "num_turns": r["num_turns"],
                    "num_tokens": int(lengths[i]),
                    "num_model_tokens": int(model_tokens[i]),
                    "strategy": r.get("strategy") or "as_sampled",
                    "error": bool(r.get("error")),
                }
            )
        with self._lock:
            self._summaries[step] = (key, out)
        return out

    def episodes(
        self, flt: EpisodeFilter, offset: int = 0, limit: int = 50
    ) -> tuple[int, list[dict[str, Any]]]:
        """(number matching, the page ``[offset, offset + limit)`` of them).

        Raises:
            KeyError: ``flt.step`` has no trajectory file.
        """
        steps = [flt.step] if flt.step is not None else self.steps()[::-1]
        total, page = 0, []
        for step in steps:
            for s in self.summaries(step):
                if flt.keep(s):
                    if offset <= total < offset + limit:
                        page.append(s)
                    total += 1
        return total, page

    def _step_trajectories(self, step: int) -> list[Trajectory]:
        path = self.step_file(step)
        if not path.is_file():
            raise KeyError(step)
        key = _file_key(path)
        with self._lock:
            if key in self._episodes:
                self._episodes.move_to_end(key)
                return self._episodes[key]
        trajs = read_trajectories(path)
        with self._lock:
            self._episodes[key] = trajs
            while len(self._episodes) > 4:
                self._episodes.popitem(last=False)
        return trajs

    def trajectory(self, step: int, index: int) -> Trajectory:
        """Episode ``index`` of ``step``.

        Raises:
            KeyError: No such step or episode.
        """
        trajs = self._step_trajectories(step)
        if not 0 <= index < len(trajs):
            raise KeyError(f"{step}-{index}")
        return trajs[index]

    # ----------------------------------------------------------------- metrics

    def metric_rows(self) -> list[dict[str, Any]]:
        """The lines of metrics.jsonl (a torn last line, as while a run writes, is skipped)."""
        path = self.path / "metrics.jsonl"
        if not path.is_file():
            return []
        rows = []
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return rows

    def config_text(self) -> str | None:
        f = self.path / "config.yaml"
        return f.read_text() if f.is_file() else None


def metric_series(
    rows: list[dict[str, Any]], keys: list[str]
) -> dict[str, dict[str, list[list[float]]]]:
    """``{key: {"train": [[step, value], …], "eval": […]}}`` of finite values."""
    out: dict[str, dict[str, list[list[float]]]] = {}
    for k in keys:
        per: dict[str, list[list[float]]] = {"train": [], "eval": []}
        for r in rows:
            v = finite_number(r.get(k))
            if v is not None and "step" in r:
                per["eval" if r.get("kind") == "eval" else "train"].append([r["step"], v])
        out[k] = per
    return out


def numeric_keys(rows: list[dict[str, Any]]) -> list[str]:
    """Every key with a finite number in some row, sorted (``step``/``time`` left out)."""
    keys = {k for r in rows for k, v in r.items() if finite_number(v) is not None}
    return sorted(keys - {"step", "time"})
