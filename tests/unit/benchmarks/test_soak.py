"""The soak's books (every episode generated, and where it went) and its probes, on run
directories and processes made here."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.reporting.run_dir import RunDir
from agentrl.types import StopReason, Trajectory
from benchmarks.soak import QUICK, Plan
from benchmarks.soak_books import books
from benchmarks.soak_probe import ProcStats, Sample, proc_stats, slope, throughput

REPO = Path(__file__).resolve().parents[3]


def _t(group: str, i: int, reason: StopReason = StopReason.DONE) -> Trajectory:
    return Trajectory(task_id="t", group_id=group, episode_id=f"{group}/{i}", stop_reason=reason)


def _line(run: RunDir, step: int, **m: float) -> None:
    with run.metrics_file.open("a") as f:
        f.write(json.dumps({"kind": "train", "step": step, **m}) + "\n")


def test_every_episode_of_a_step_is_trained_discarded_or_dropped_with_its_group(tmp_path):
    run = RunDir(tmp_path)
    # Step 1: groups a, b trained whole. Step 2: group c trained, one of d's episodes broke
    # and d went with it (too few episodes), e dropped whole (zero reward std).
    run.save_trajectories(1, [_t("a", 0), _t("a", 1), _t("b", 0), _t("b", 1)])
    _line(run, 1, **{"episodes/generated": 4, "episodes/discarded": 0})
    run.save_trajectories(2, [_t("c", 0), _t("c", 1)])
    run.save_discarded(2, [("env_error", _t("d", 0, StopReason.ENV_ERROR))])
    _line(run, 2, **{"episodes/generated": 6, "episodes/discarded": 1,
                     "discard/episode:env_error": 1, "discard/group:too_few_episodes": 1,
                     "discard/group:zero_reward_std": 1})  # fmt: skip
    b = books(tmp_path, group_size=2)
    assert (b.steps, b.generated, b.trained) == (2, 10, 6)
    assert b.discarded == {"env_error": 1}
    assert b.dropped_with_group == 3  # d's other episode, e's two
    assert b.group_drops == {"too_few_episodes": 1, "zero_reward_std": 1}
    assert b.unaccounted == 0 and b.mismatched_steps == []


def test_a_lost_episode_or_a_wrong_discard_count_shows(tmp_path):
    run = RunDir(tmp_path)
    run.save_trajectories(1, [_t("a", 0)])  # a's second episode vanished
    _line(run, 1, **{"episodes/generated": 4, "episodes/discarded": 1})  # none saved
    run.save_trajectories(2, [_t("b", 0), _t("b", 1)])
    _line(run, 2, **{"episodes/generated": 2, "episodes/discarded": 0})
    b = books(tmp_path, group_size=2)
    assert b.unaccounted == 3 and b.mismatched_steps == [1]


def test_the_last_line_of_a_step_counts_and_superseded_steps_are_their_own_count(tmp_path):
    run = RunDir(tmp_path)
    run.save_trajectories(1, [_t("a", 0), _t("a", 1)])
    _line(run, 1, **{"episodes/generated": 2, "episodes/discarded": 0})
    _line(run, 1, **{"episodes/generated": 2, "episodes/discarded": 0})
    (tmp_path / "superseded.jsonl").write_text(
        json.dumps({"kind": "train", "step": 2, "episodes/generated": 4})
        + "\n"
        + json.dumps({"step": 2, "tasks": [3, 4]})
        + "\n"
    )
    b = books(tmp_path, group_size=2)
    assert (b.generated, b.trained, b.unaccounted) == (2, 2, 0)
    assert (b.superseded_steps, b.superseded_episodes) == (1, 4)


def test_slope_is_per_hour_and_flat_data_has_none():
    assert slope([(0.0, 5.0), (60.0, 6.0), (120.0, 7.0)]) == 60.0
    assert slope([(t, 3.0) for t in (0.0, 10.0, 20.0)]) == 0.0
    assert slope([(0.0, 1.0)]) == 0.0


def test_throughput_is_tokens_between_first_and_last_sample():
    def s(t: float, tok: float) -> Sample:
        return Sample(t, ProcStats(), ProcStats(), 0, 0, 0, tok, 0, "")

    assert throughput([s(0, 0), s(5, 40), s(10, 100)]) == 10.0
    assert throughput([s(0, 0)]) == 0.0


def test_proc_stats_sees_this_process_and_skips_a_gone_one():
    me = proc_stats([os.getpid()])
    assert me.procs == 1 and me.rss_bytes > 10 << 20 and me.fds >= 3 and me.threads >= 1
    assert proc_stats([os.getpid(), 2**22 + 1]).procs == 1


def test_every_fault_of_the_plan_falls_inside_the_soak_and_quick_fits_make_test():
    for plan in (Plan(), QUICK):
        faults = plan.faults()
        kinds = [f for _, f in faults]
        for k in ("freeze", "trainer_kill", "disk_full", "container_kill"):
            assert kinds.count(k) == 1
        assert kinds.count("server_kill") >= 2
        assert all(0 < t < plan.seconds for t, _ in faults)
        assert plan.freeze_s > plan.request_timeout_s  # the hang outlasts a request
    assert QUICK.minutes <= 5


def test_agentrl_shm_bytes_counts_its_own_entries_only(tmp_path):
    from benchmarks.soak_probe import agentrl_shm_bytes

    (tmp_path / "agentrl-w1").mkdir()
    (tmp_path / "agentrl-w1" / "model.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "agentrl-f").write_bytes(b"y" * 10)
    (tmp_path / "vllm-ipc").write_bytes(b"z" * 5000)
    assert agentrl_shm_bytes(str(tmp_path)) == 1010


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def _python(code: str) -> tuple[subprocess.Popen[str], str]:
    """Runs ``code`` (then a long sleep) in a Python of its own; returns it and its first
    line of output."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, time\n{code}time.sleep(300)\n"],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def test_a_run_started_by_the_harness_dies_with_the_thread_that_started_it():
    # The harness's TrainProc starts `agentrl train` with die_with_parent: a test or soak
    # SIGKILLed mid-run takes its run along (the run's own watchdog then cleans up).
    parent, said = _python(
        "from tests.chaos.harness import die_with_parent\n"
        "p = subprocess.Popen(['sleep', '300'], preexec_fn=die_with_parent)\n"
        "print(p.pid, flush=True)\n"
    )
    child = int(said)
    try:
        assert not _gone(child, 0.3)  # alive while its parent is
        parent.kill()
        parent.wait()
        assert _gone(child, 5.0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace and a tmpfs need root")
def test_the_soak_s_tmpfs_is_seen_by_it_alone_and_goes_when_it_is_killed(tmp_path):
    target = tmp_path / "disk"
    target.mkdir()
    soak, said = _python(
        "from benchmarks.soak import own_mount_namespace\n"
        "own_mount_namespace()\n"
        f"subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', {str(target)!r}],"
        " check=True)\n"
        "print('mounted', flush=True)\n"
    )
    try:
        assert said == "mounted"
        assert str(target) in Path(f"/proc/{soak.pid}/mounts").read_text()
        assert str(target) not in Path("/proc/self/mounts").read_text()  # not the host's
    finally:
        soak.kill()
        soak.wait()
    everywhere = ""
    for p in Path("/proc").glob("[0-9]*/mounts"):
        with contextlib.suppress(OSError):
            everywhere += p.read_text()
    assert str(target) not in everywhere
