"""Atomic checkpoint directories and RNG state capture.

A checkpoint is written into a hidden temporary directory beside its final place,
flushed to disk, then renamed into place (``os.replace`` is atomic on POSIX); the
``latest`` pointer is replaced the same way last. A crash at any moment leaves the
previous checkpoint and pointer intact.
"""

from __future__ import annotations

import os
import random
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "atomic_checkpoint_dir",
    "capture_rng_state",
    "list_checkpoints",
    "prune_checkpoints",
    "resolve_checkpoint",
    "restore_rng_state",
]

LATEST = "latest"
PREFIX = "step_"


def capture_rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU and (when present) CUDA generator states."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of ``capture_rng_state``."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_checkpoint_dir(root: str | Path, step: int, write: Callable[[Path], None]) -> Path:
    """Calls ``write(tmp_dir)``, moves it to ``root/step_<step>``, points ``latest`` at it."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step}"
    tmp = root / f".tmp-{PREFIX}{step}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        write(tmp)
        _fsync_tree(tmp)
        if final.exists():
            old = root / f".old-{PREFIX}{step}-{uuid.uuid4().hex[:8]}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    ptr_tmp = root / f".{LATEST}.{uuid.uuid4().hex[:8]}"
    ptr_tmp.write_text(final.name)
    with open(ptr_tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(ptr_tmp, root / LATEST)
    return final


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under root, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)]
    found = [p for p in found if p.name[len(PREFIX) :].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def resolve_checkpoint(path: str | Path) -> Path:
    """A step directory, or the one a root's ``latest`` names (else its newest).

    Raises:
        FileNotFoundError: When there is no checkpoint there.
    """
    p = Path(path)
    if (p / "trainer_state.pt").is_file():
        return p
    ptr = p / LATEST
    if ptr.is_file():
        cand = p / ptr.read_text().strip()
        if (cand / "trainer_state.pt").is_file():
            return cand
    found = list_checkpoints(p)
    if not found:
        raise FileNotFoundError(f"no checkpoint under {p}")
    return found[-1]


def prune_checkpoints(root: str | Path, keep: int) -> None:
    """Deletes all but the newest ``keep`` checkpoints (never the one ``latest`` names)."""
    root = Path(root)
    ptr = root / LATEST
    latest = ptr.read_text().strip() if ptr.is_file() else None
    found = list_checkpoints(root)
    for p in found[: max(len(found) - keep, 0)]:
        if p.name != latest:
            shutil.rmtree(p, ignore_errors=True)
