"""What the inspector reads from a run directory: steps, episode summaries, episodes, metrics.

Only the files a request needs are read: a step's episode list reads that step's
small columns (ids, reward, stop reason, loss mask), cached until the file changes;
one episode reads its step's file once (the last few files stay cached).

A step's episodes are those it trained on (``trajectories/step_N.parquet``) followed by
those it discarded (``discarded/step_N.parquet``: agent, env, server errors, with their
tracebacks in ``error``); a discarded episode's summary has ``discarded`` true and its
``discard_reason``.
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
_DISCARD_REASON = "discard_reason"  # the extra column of a discarded/ file (reporting.run_dir)


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
        self._summaries: dict[int, tuple[Any, list[dict[str, Any]]]] = {}
        self._episodes: OrderedDict[tuple[str, int, int], list[Trajectory]] = OrderedDict()

    # ------------------------------------------------------------------ steps

    def step_file(self, step: int) -> Path:
        return self.path / "trajectories" / f"step_{step:06d}.parquet"

    def discarded_file(self, step: int) -> Path:
        """The step's discarded episodes (absent when none was discarded)."""
        return self.path / "discarded" / f"step_{step:06d}.parquet"

    def _files(self, step: int) -> list[Path]:
        """The step's files that exist: trained episodes, then discarded ones.

        Raises:
            KeyError: The step has neither.
        """
        files = [f for f in (self.step_file(step), self.discarded_file(step)) if f.is_file()]
        if not files:
            raise KeyError(step)
        return files

    def steps(self) -> list[int]:
        """Steps with a trajectory file (or a file of discarded episodes), ascending."""
        out: set[int] = set()
        for d in ("trajectories", "discarded"):
            for f in (self.path / d).glob("step_*.parquet"):
                try:
                    out.add(int(f.stem.removeprefix("step_")))
                except ValueError:
                    continue
        return sorted(out)

    def num_episodes(self, step: int) -> int:
        """Episodes of a step, discarded ones included (read from the parquet footers only)."""
        files = [f for f in (self.step_file(step), self.discarded_file(step)) if f.is_file()]
        return sum(int(pq.ParquetFile(f).metadata.num_rows) for f in files)

    # ---------------------------------------------------------------- episodes

    def summaries(self, step: int) -> list[dict[str, Any]]:
        """One small dict per episode of ``step`` (no token lists), discarded ones last.

        Raises:
            KeyError: No trajectory file for ``step``.
        """
        files = self._files(step)
        key = tuple(_file_key(f) for f in files)
        with self._lock:
            hit = self._summaries.get(step)
        if hit is not None and hit[0] == key:
            return hit[1]
        out: list[dict[str, Any]] = []
        for path in files:
            out += _summaries(path, step, start=len(out))
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

    def _file_trajectories(self, path: Path) -> list[Trajectory]:
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
        """Episode ``index`` of ``step`` (past the trained episodes: the discarded ones).

        Raises:
            KeyError: No such step or episode.
        """
        rest = index
        if rest >= 0:
            for path in self._files(step):
                trajs = self._file_trajectories(path)
                if rest < len(trajs):
                    return trajs[rest]
                rest -= len(trajs)
        raise KeyError(f"{step}-{index}")

    def file_of(self, step: int, index: int) -> tuple[list[Trajectory], int, bool]:
        """The episodes of the file of ``step`` that holds episode ``index`` (the step's
        trained batch, or its discarded episodes), the index of its first, and whether
        they are the discarded ones.

        Raises:
            KeyError: No such step or episode.
        """
        start = 0
        if index >= 0:
            for path in self._files(step):
                trajs = self._file_trajectories(path)
                if index < start + len(trajs):
                    return trajs, start, path.parent.name == "discarded"
                start += len(trajs)
        raise KeyError(f"{step}-{index}")

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


def _summaries(path: Path, step: int, *, start: int) -> list[dict[str, Any]]:
    """The summaries of one file of ``step``; its first episode has index ``start``."""
    names = set(pq.ParquetFile(path).schema_arrow.names)
    extra = ("strategy", "error", _DISCARD_REASON, "loss_mask")
    cols = [c for c in (*_SUMMARY_COLUMNS, *extra) if c in names]
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
                "id": f"{step}-{start + i}",
                "step": step,
                "index": start + i,
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
                "discarded": _DISCARD_REASON in names,
                "discard_reason": r.get(_DISCARD_REASON),
            }
        )
    return out


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
