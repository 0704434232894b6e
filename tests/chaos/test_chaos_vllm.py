"""Chaos: the vLLM server frozen past the health timeout, then SIGKILLed mid-step.

One run per mode attaches to the suite's server. After step 1 the server's process
group is stopped (SIGSTOP) for longer than the fleet's health checks take to mark it
down, then continued; after step 2 it is SIGKILLed while step 3 generates, and the
suite restarts it on the same port, as a supervisor would. The run must finish every
step with no task lost or trained twice, and leave nothing behind. (In ``fully_async``
mode the short soak, tests/chaos/test_soak.py, injects both faults against two servers.)
"""

from __future__ import annotations

import time

import pytest

from tests.chaos.harness import ChaosRecord, LeakWatch, TrainProc, account, overrides

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(900)]

STEPS = 3
FREEZE_S = 16.0  # > health timeout (5 s) × 2 failed checks + the 2 s interval


def _fill(rec: ChaosRecord, run_dir, steps: list[int]) -> None:
    acc = account(run_dir)
    rec.episodes_lost = acc.lost * 2
    rec.duplicated = acc.duplicated * 2
    rec.steps_lost = len(set(range(1, STEPS + 1)) - set(steps))


@pytest.mark.parametrize("mode", ["sync"])
def test_vllm_frozen_then_killed_mid_step(chaos_model, chaos_server, tmp_path, mode):
    frozen = ChaosRecord("vllm-sigstop-past-health-timeout", mode)
    killed = ChaosRecord("vllm-sigkill-mid-step", mode)
    watch = LeakWatch()
    args = overrides(
        chaos_model, chaos_server.url, tmp_path, "v", steps=STEPS,
        **{"orchestration.mode": mode, "orchestration.partial_rollout": True},
    )  # fmt: skip
    run = TrainProc(args, tmp_path / "v", watch.case_id)
    watch.own(run.pid)
    try:
        run.wait_step(1, timeout=400)
        time.sleep(0.5)  # into step 2's generation
        chaos_server.freeze()
        try:
            time.sleep(FREEZE_S)
        finally:
            chaos_server.thaw()
        t0 = time.monotonic()
        run.wait_step(2, timeout=300)
        frozen.recovery_s = round(time.monotonic() - t0, 1)
        frozen.outcome = "recovered"
        frozen.detail = f"stopped {FREEZE_S:.0f}s during step 2; step 2 done after SIGCONT"

        time.sleep(1.0)  # into step 3's generation
        t1 = time.monotonic()
        chaos_server.kill()
        restart_s = chaos_server.start()
        run.wait_step(3, timeout=300)
        killed.recovery_s = round(time.monotonic() - t1, 1)
        killed.detail = f"SIGKILL during step 3; the server restarted in {restart_s:.0f}s"
        rc = run.wait(timeout=300)
        assert rc == 0, run.output()[-4000:]
        killed.outcome = "recovered"
        steps = run.steps()
        for rec in (frozen, killed):
            _fill(rec, run.run_dir, steps)
        killed.leaks = watch.leaks()
        assert steps == [1, 2, 3], steps
        assert killed.episodes_lost == 0 and killed.duplicated == 0, account(run.run_dir)
        assert not killed.leaks, killed.leaks
    finally:
        for rec in (frozen, killed):
            if rec.outcome == "unknown":
                rec.outcome = "failed"
            rec.write()
        run.kill()
        watch.clean()
