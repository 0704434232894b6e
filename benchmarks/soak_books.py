"""The soak's episode books: every episode a run generated, and where it went.

Read from the run directory alone, step by step (the last ``train`` line of each step in
``metrics.jsonl``, its ``trajectories/`` and ``discarded/`` files):

- **trained**: rows of the step's trajectory file;
- **discarded** for their own sake: rows of its ``discarded/`` file, by stop reason, and
  their count must equal the step's ``episodes/discarded``;
- **dropped with their group**: a group dropped for a group reason (``discard/group:*``)
  takes its episodes that did not fail with it (``group_size`` less its failed ones);
- **superseded**: steps logged, then lost to a crash before their checkpoint
  (``superseded.jsonl``); the resumed run generated them again.

``unaccounted`` is what is left: generated less trained, discarded and dropped with their
group, over every step. A lost episode makes it positive, one counted twice negative.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Books:
    """Episode counts of one run (see the module's docstring)."""

    steps: int = 0
    generated: int = 0
    trained: int = 0
    discarded: Counter[str] = field(default_factory=Counter)
    dropped_with_group: int = 0
    group_drops: Counter[str] = field(default_factory=Counter)
    superseded_steps: int = 0
    superseded_episodes: int = 0
    mismatched_steps: list[int] = field(default_factory=list)
    """Steps whose ``discarded/`` file disagrees with their ``episodes/discarded``."""

    @property
    def unaccounted(self) -> int:
        dropped = sum(self.discarded.values()) + self.dropped_with_group
        return self.generated - self.trained - dropped


def _lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _train_lines(path: Path) -> dict[int, dict[str, Any]]:
    last: dict[int, dict[str, Any]] = {}
    for m in _lines(path):
        if m.get("kind", "train") == "train" and "step" in m:
            last[int(m["step"])] = m
    return last


def books(run_dir: Path, group_size: int) -> Books:
    """The :class:`Books` of the run in ``run_dir`` as it is on disk now."""
    from agentrl.reporting.run_dir import read_discarded, read_trajectories

    b = Books()
    for step, m in sorted(_train_lines(run_dir / "metrics.jsonl").items()):
        b.steps += 1
        b.generated += int(m.get("episodes/generated", 0))
        traj = run_dir / "trajectories" / f"step_{step:06d}.parquet"
        trained_groups: set[str] = set()
        if traj.exists():
            rows = read_trajectories(traj)
            b.trained += len(rows)
            trained_groups = {t.group_id for t in rows}
        disc = run_dir / "discarded" / f"step_{step:06d}.parquet"
        failed = read_discarded(disc) if disc.exists() else []
        b.discarded.update(reason for reason, _ in failed)
        if len(failed) != int(m.get("episodes/discarded", 0)):
            b.mismatched_steps.append(step)
        dropped_groups = 0
        for k, v in m.items():
            if k.startswith("discard/group:") and v:
                b.group_drops[k.removeprefix("discard/group:")] += int(v)
                dropped_groups += int(v)
        failed_in_dropped = sum(1 for _, t in failed if t.group_id not in trained_groups)
        b.dropped_with_group += dropped_groups * group_size - failed_in_dropped
    for m in _lines(run_dir / "superseded.jsonl"):
        if m.get("kind", "train") == "train" and "episodes/generated" in m:
            b.superseded_steps += 1
            b.superseded_episodes += int(m["episodes/generated"])
    return b
