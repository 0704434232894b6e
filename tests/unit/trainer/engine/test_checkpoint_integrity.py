"""Checkpoint integrity (issue #18/#14): verified saves, fallback past a corrupt newest
checkpoint, and a full disk that leaves the last good checkpoint intact.

The full disk is real: a small tmpfs mounted for the test (we run as root in CI and
here). Where mounting is not permitted the test uses RLIMIT_FSIZE instead (the
kernel refuses writes past a file size with EFBIG): still a real refusal by the
kernel, not a mocked exception.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.engine.checkpoint import (
    DiskFullError,
    NoCheckpointError,
    atomic_checkpoint_dir,
    select_checkpoint,
    verify_checkpoint,
)
from tests.helpers.disk import small_disk
from tests.helpers.trainer import random_batch, tiny_lm

torch.set_num_threads(2)


def _trainer(root: Path, keep: int = 3) -> Trainer:
    return Trainer(
        TrainerConfig(seed=1, checkpoint={"dir": str(root), "keep_last": keep}), tiny_lm()
    )


def _two_checkpoints(root: Path) -> Trainer:
    t = _trainer(root)
    t.step(random_batch(4))
    t.save_checkpoint()
    t.step(random_batch(4))
    t.save_checkpoint()
    return t


def test_a_saved_checkpoint_has_a_manifest_and_verifies(tmp_path: Path) -> None:
    _two_checkpoints(tmp_path / "c")
    for step in ("step_1", "step_2"):
        assert (tmp_path / "c" / step / "manifest.json").is_file()
        assert verify_checkpoint(tmp_path / "c" / step) is None


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(
    tmp_path: Path, damage: str
) -> None:
    root = tmp_path / "c"
    _two_checkpoints(root)
    bad = root / "step_2" / "model_policy.pt"
    data = bad.read_bytes()
    if damage == "truncate":
        bad.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        bad.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    else:
        bad.unlink()
    said: list[str] = []
    assert select_checkpoint(root, said.append) == root / "step_1"
    assert str(bad) in said[0] and "step_2 is unusable" in said[0]
    assert said[-1] == "falling back to checkpoint step_1"
    fresh = _trainer(root)
    fresh.load_checkpoint(root)  # the trainer's own resume makes the same choice
    assert fresh.global_step == 1


def test_a_checkpoint_without_trainer_state_is_not_chosen(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _two_checkpoints(root)
    (root / "step_2" / "trainer_state.pt").write_bytes(b"")  # cut short
    assert select_checkpoint(root) == root / "step_1"


def test_no_good_checkpoint_names_every_bad_file(tmp_path: Path) -> None:
    with pytest.raises(NoCheckpointError, match=r"no checkpoint in .*none was saved"):
        select_checkpoint(tmp_path / "empty")
    root = tmp_path / "c"
    _two_checkpoints(root)
    for s in ("step_1", "step_2"):
        (root / s / "optim_policy.pt").write_bytes(b"x")
    with pytest.raises(NoCheckpointError) as err:
        select_checkpoint(root)
    msg = str(err.value)
    assert str(root / "step_1" / "optim_policy.pt") in msg
    assert str(root / "step_2" / "optim_policy.pt") in msg


def test_resume_without_a_checkpoint_is_one_clear_message(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for target, expect in ((run, "no checkpoint in"), (tmp_path / "nope", "no such run directory")):
        proc = subprocess.run(
            [sys.executable, "-m", "agentrl.cli", "train", "--resume", str(target)],
            capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"},
        )  # fmt: skip
        out = " ".join((proc.stdout + proc.stderr).split())
        assert proc.returncode != 0 and expect in out, out
        assert "Traceback" not in out, out


def _ckpt_bytes(tmp: Path) -> int:
    t = _trainer(tmp / "probe")
    t.step(random_batch(4))
    path = t.save_checkpoint()
    return sum(p.stat().st_size for p in path.iterdir())


def test_a_full_disk_mid_checkpoint_keeps_the_last_good_one(tmp_path: Path) -> None:
    one = _ckpt_bytes(tmp_path)
    disk = tmp_path / "disk"
    with small_disk(disk, int(one * 1.6)) as (kind, fill, _):
        root = disk / "c"
        t = _trainer(root)
        t.step(random_batch(4))
        good = t.save_checkpoint()
        t.step(random_batch(4))
        fill()
        # The trainer's save: refused up front on tmpfs (the space check), or by the
        # kernel mid-write; either way one message naming the path and the size.
        with pytest.raises(DiskFullError) as err:
            t.save_checkpoint()
        msg = str(err.value)
        assert msg.startswith("disk full:") and str(root / "step_2") in msg
        if kind == "tmpfs":
            assert "needs about" in msg and "MB free" in msg
        # A write that the space check cannot foresee fails for real in the kernel.
        big = torch.zeros(one // 2)

        def write(d: Path) -> None:
            with open(d / "blob.pt", "wb") as f:
                torch.save(big, f)

        with pytest.raises(DiskFullError, match=r"disk full:.*step_3"):
            atomic_checkpoint_dir(root, 3, write)
        # The last good checkpoint is intact and chosen; nothing half-written is left.
        assert select_checkpoint(root) == good and verify_checkpoint(good) is None
        assert sorted(p.name for p in root.iterdir()) == ["latest", "step_1"]
        fresh = _trainer(root)
        fresh.load_checkpoint(root)
        assert fresh.global_step == 1
