"""Atomic, verified checkpoint directories and RNG state capture.

A checkpoint is written into a hidden temporary directory beside its final place;
a ``manifest.json`` (size and SHA-256 of every file) is written last, everything is
flushed to disk (files, then the directory), and the directory is renamed into
place (``os.replace`` is atomic on POSIX); the ``latest`` pointer is replaced the
same way last. A crash or a full disk at any moment leaves the previous checkpoint
and pointer intact, and older checkpoints are pruned only after the new one is in
place and verified.

On resume, :func:`select_checkpoint` verifies the newest checkpoint against its
manifest and falls back to the previous good one (saying why) when it is
truncated or corrupt.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "CheckpointError",
    "DiskFullError",
    "NoCheckpointError",
    "atomic_checkpoint_dir",
    "capture_rng_state",
    "list_checkpoints",
    "prune_checkpoints",
    "resolve_checkpoint",
    "restore_rng_state",
    "select_checkpoint",
    "verify_checkpoint",
]

LATEST = "latest"
PREFIX = "step_"
MANIFEST = "manifest.json"
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the cause."""


class DiskFullError(CheckpointError):
    """The disk (or quota, or file size limit) ran out while writing a checkpoint."""


class NoCheckpointError(CheckpointError, FileNotFoundError):
    """There is no (good) checkpoint where one was asked for."""


def capture_rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU and (when present) CUDA generator states."""
    import numpy as np
    import torch

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
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_manifest(path: Path) -> None:
    files = {
        p.relative_to(path).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    (path / MANIFEST).write_text(json.dumps({"version": 1, "files": files}, indent=1))


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            _fsync_path(p)
    _fsync_path(path)


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def _disk_full(root: Path, final: Path, need: int | None, e: OSError | None) -> DiskFullError:
    free = _free_bytes(root)
    need_s = f"needs about {_mb(need)}" if need else "could not be written"
    free_s = f", {_mb(free)} free there" if free is not None else ""
    why = f" ({e.strerror or e})" if e is not None else ""
    return DiskFullError(
        f"disk full: checkpoint {final} {need_s}{free_s}{why}; free space on {root} "
        "(or set checkpoint.keep_last lower / point output_dir elsewhere); the previous "
        "checkpoint is kept intact"
    )


def atomic_checkpoint_dir(
    root: str | Path,
    step: int,
    write: Callable[[Path], None],
    *,
    expected_bytes: int | None = None,
) -> Path:
    """Calls ``write(tmp_dir)``, verifies it, moves it to ``root/step_<step>``, points
    ``latest`` at it.

    Args:
        root: Checkpoint root.
        step: Step number (the directory's name).
        write: Writes the checkpoint's files into the directory it is given.
        expected_bytes: About how much ``write`` writes; refused up front (nothing
            written) when the disk has less free.

    Raises:
        DiskFullError: Not enough space (before or while writing); nothing of the new
            checkpoint is left behind and the previous one stays intact. ``write``
            should write through Python file objects (``torch.save(obj, f)``) so that
            the out-of-space error reaches here.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step}"
    free = _free_bytes(root)
    if expected_bytes and free is not None and free < expected_bytes * 1.02 + (64 << 10):
        raise _disk_full(root, final, expected_bytes, None)
    tmp = root / f".tmp-{PREFIX}{step}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        write(tmp)
        _write_manifest(tmp)
        _fsync_tree(tmp)
        problem = verify_checkpoint(tmp, hashes=False)  # just hashed: sizes and presence
        if problem:
            raise CheckpointError(f"checkpoint {final} failed verification: {problem}")
        if final.exists():
            old = root / f".old-{PREFIX}{step}-{uuid.uuid4().hex[:8]}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        ptr_tmp = root / f".{LATEST}.{uuid.uuid4().hex[:8]}"
        try:
            ptr_tmp.write_text(final.name)
            _fsync_path(ptr_tmp)
            os.replace(ptr_tmp, root / LATEST)
        finally:
            ptr_tmp.unlink(missing_ok=True)
        _fsync_path(root)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        full = _disk_full_cause(e)
        if full is not None:
            raise _disk_full(root, final, expected_bytes, full) from e
        raise
    return final


def _disk_full_cause(e: BaseException) -> OSError | None:
    """The out-of-space OSError behind ``e`` (torch.save wraps it in a RuntimeError)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in _DISK_FULL:
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def verify_checkpoint(path: str | Path, *, hashes: bool = True) -> str | None:
    """Checks a checkpoint directory against its manifest (sizes, and with ``hashes``
    the SHA-256 of every file).

    Returns:
        None when it is complete and every file matches its size and SHA-256; else
        what is wrong, naming the file. A checkpoint written before manifests existed
        passes when its ``trainer_state.pt`` is there (it is checked by loading).
    """
    p = Path(path)
    man = p / MANIFEST
    if not man.is_file():
        if (p / "trainer_state.pt").is_file():
            return None
        return f"{p / 'trainer_state.pt'} is missing (incomplete checkpoint)"
    try:
        files = json.loads(man.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{man} is unreadable ({e})"
    for name, meta in files.items():
        f = p / name
        if not f.is_file():
            return f"{f} is missing"
        size = f.stat().st_size
        if size != meta["size"]:
            return f"{f} is truncated or changed ({size} bytes, {meta['size']} written)"
        if hashes and _sha256(f) != meta["sha256"]:
            return f"{f} is corrupt (SHA-256 does not match the manifest)"
    if "trainer_state.pt" not in files:
        return f"{p / 'trainer_state.pt'} is missing (incomplete checkpoint)"
    return None


def list_checkpoints(root: str | Path) -> list[Path]:
    """Checkpoint directories under root (verified or not), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)]
    found = [p for p in found if p.name[len(PREFIX) :].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def _candidates(p: Path) -> list[Path]:
    """Step directories to try, best first: the one ``latest`` names, then newest first."""
    if (p / "trainer_state.pt").is_file() or (p / MANIFEST).is_file():
        return [p]
    found = list(reversed(list_checkpoints(p)))
    ptr = p / LATEST
    if ptr.is_file():
        named = p / ptr.read_text().strip()
        if named in found:
            found.remove(named)
            found.insert(0, named)
    return found


def select_checkpoint(
    path: str | Path,
    say: Callable[[str], None] | None = None,
    *,
    skip: Callable[[Path], str | None] | None = None,
) -> Path:
    """The newest good checkpoint: a step directory, or under a root.

    A newest checkpoint that is truncated or corrupt is passed over for the previous
    one, with a message through ``say`` naming the bad file.

    Args:
        path: A step directory or a checkpoint root.
        say: Receives a message for each checkpoint passed over.
        skip: Extra check of a candidate (e.g. that it loads); returns why it is bad.

    Raises:
        NoCheckpointError: There is no checkpoint there, or none is good (each named).
    """
    p = Path(path)
    cands = _candidates(p)
    if not cands:
        raise NoCheckpointError(f"no checkpoint in {p} (none was saved there)")
    bad: list[str] = []
    for c in cands:
        problem = verify_checkpoint(c) or (skip(c) if skip else None)
        if problem is None:
            if bad and say is not None:
                say(f"falling back to checkpoint {c.name}")
            return c
        bad.append(f"{c.name}: {problem}")
        if say is not None:
            say(f"checkpoint {c.name} is unusable: {problem}")
    raise NoCheckpointError(f"no usable checkpoint in {p}: " + "; ".join(bad))


def resolve_checkpoint(path: str | Path) -> Path:
    """A step directory, or the newest good one under a root (see :func:`select_checkpoint`).

    Raises:
        NoCheckpointError: When there is no good checkpoint there.
    """
    return select_checkpoint(path)


def prune_checkpoints(root: str | Path, keep: int) -> None:
    """Deletes all but the newest ``keep`` checkpoints (never the one ``latest`` names)."""
    root = Path(root)
    ptr = root / LATEST
    latest = ptr.read_text().strip() if ptr.is_file() else None
    found = list_checkpoints(root)
    for p in found[: max(len(found) - keep, 0)]:
        if p.name != latest:
            shutil.rmtree(p, ignore_errors=True)
    for p in root.iterdir():  # leftovers of saves killed midway (never the live ones)
        if p.name.startswith((".tmp-", ".old-")) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
