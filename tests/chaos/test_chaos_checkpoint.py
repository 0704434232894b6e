"""Chaos: the run directory's disk fills during a checkpoint; the newest checkpoint is corrupt.

The run directory lives on its own small tmpfs. After step 1's checkpoint the disk is
filled, so step 2's checkpoint fails: the run must stop with one clear message (no
traceback), keep step 1's checkpoint intact, and resume once space is back. Then the
newest checkpoint of the finished run is truncated: a resume must fall back to the
previous checkpoint and say so, or refuse with a clear message.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.harness import (
    ChaosRecord,
    LeakWatch,
    TrainProc,
    account,
    checkpoint_state,
    fill_disk,
    overrides,
    says_disk_full,
    train_steps,
)

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(900)]

STEPS = 3


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 96 MB tmpfs of its own (needs root, as CI and this machine have)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(mnt)],
        capture_output=True, text=True,
    )  # fmt: skip
    if r.returncode != 0:
        pytest.fail(f"cannot mount a small tmpfs for the disk-full case: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_disk_full_during_checkpoint_then_resume_then_corrupt_checkpoint(
    chaos_model, chaos_server, small_disk
):
    full = ChaosRecord("disk-full-during-checkpoint", "sync")
    corrupt = ChaosRecord("corrupt-newest-checkpoint", "sync")
    watch = LeakWatch()
    run_dir = small_disk / "d"
    args = overrides(chaos_model, chaos_server.url, small_disk, "d", steps=STEPS)
    run = TrainProc(args, run_dir, watch.case_id)
    watch.own(run.pid)
    try:
        # --- disk full: step 2's checkpoint cannot be written
        run.wait_for(
            lambda: (run_dir / "checkpoints" / "latest").is_file(), 400, "step 1's checkpoint"
        )
        good = (run_dir / "checkpoints" / "latest").read_text().strip()
        filler = fill_disk(small_disk, leave_bytes=256 * 1024)
        rc = run.wait(timeout=300)
        out = run.output()
        full.detail = f"exit {rc}; last lines: {out.strip().splitlines()[-1][:200]!r}"
        assert rc != 0, out[-3000:]
        assert says_disk_full(out), out[-3000:]
        assert (run_dir / "checkpoints" / "latest").read_text().strip() == good
        assert int(checkpoint_state(run_dir)["step"]) == 1  # loads: intact
        leftovers = [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
        assert not leftovers, f"partial checkpoint files left on the full disk: {leftovers}"
        filler.unlink()
        t0 = time.monotonic()
        resumed = TrainProc([f"steps={STEPS}", "--resume", str(run_dir)], run_dir, watch.case_id,
                            ".2")  # fmt: skip
        watch.own(resumed.pid)
        rc = resumed.wait(timeout=400)
        assert rc == 0, resumed.output()[-4000:]
        full.recovery_s = round(time.monotonic() - t0, 1)
        acc = account(run_dir)
        steps = train_steps(run_dir)
        full.episodes_lost, full.duplicated = acc.lost * 2, acc.duplicated * 2
        full.steps_lost = len(set(range(1, STEPS + 1)) - set(steps))
        full.outcome = "clear error, resumed"
        assert acc.lost == 0 and acc.duplicated == 0, acc
        assert steps == list(range(1, STEPS + 1)), f"train lines of metrics.jsonl: {steps}"

        # --- the newest checkpoint truncated
        ckpts = run_dir / "checkpoints"
        newest = ckpts / (ckpts / "latest").read_text().strip()
        weights = newest / "model_policy.pt"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        t0 = time.monotonic()
        again = TrainProc([f"steps={STEPS + 1}", "--resume", str(run_dir)], run_dir,
                          watch.case_id, ".3")  # fmt: skip
        watch.own(again.pid)
        rc = again.wait(timeout=400)
        out = again.output()
        corrupt.recovery_s = round(time.monotonic() - t0, 1)
        if rc == 0:
            corrupt.outcome = "fell back"
            acc = account(run_dir)
            steps = train_steps(run_dir)
            corrupt.episodes_lost, corrupt.duplicated = acc.lost * 2, acc.duplicated * 2
            corrupt.steps_lost = len(set(range(1, STEPS + 2)) - set(steps))
            assert newest.name in out and "Traceback" not in out, out[-3000:]
            assert steps[-1] == STEPS + 1 and acc.lost == 0 and acc.duplicated == 0, (steps, acc)
        else:
            corrupt.outcome = "refused clearly"
            corrupt.steps_lost = 0
            assert newest.name in out and "Traceback" not in out, out[-3000:]
        corrupt.detail = f"exit {rc}; {out.strip().splitlines()[-1][:200]!r}"
        full.leaks = corrupt.leaks = watch.leaks()
        assert not full.leaks, full.leaks
    finally:
        for rec in (full, corrupt):
            if rec.outcome == "unknown":
                rec.outcome = "failed"
            rec.write()
        watch.clean()
