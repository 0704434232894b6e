"""Chaos: the trainer process SIGKILLed mid-update, then ``agentrl train --resume``.

The update is made long enough (PPO epochs) that a kill timed from step 2's own
timings lands inside step 3's update; the resumed run must train every task exactly
once (task indices of the trained groups against the task stream's record) and log
steps 1..N once each. (In ``fully_async`` mode the short soak, tests/chaos/test_soak.py,
SIGKILLs the run while generation and updates overlap, and checks the same.)
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.chaos.harness import ChaosRecord, LeakWatch, TrainProc, account, metrics, overrides

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(600)]

STEPS = 3
# Long enough an update that the kill, aimed at its middle, has ~2 s either side: with 8
# epochs (1.4 s) a fast step 3 sometimes finished before the kill, and with 24 (2.3 s on a
# faster machine) so did fully_async's, whose step 3 no longer waits for step 2's push.
EPOCHS = 48


@pytest.mark.parametrize("mode", ["sync"])
def test_trainer_sigkill_mid_update_then_resume(chaos_model, chaos_server, tmp_path, mode):
    rec = ChaosRecord("trainer-sigkill-mid-update", mode)
    watch = LeakWatch()
    args = overrides(
        chaos_model, chaos_server.url, tmp_path, "k", steps=STEPS,
        **{"orchestration.mode": mode, "trainer.update.epochs": EPOCHS},
    )  # fmt: skip
    run = TrainProc(args, tmp_path / "k", watch.case_id)
    watch.own(run.pid)
    try:
        run.wait_step(2, timeout=400)
        # Step 2's own timings (step 1's include one-off warm-up) place the kill inside
        # step 3's update: after step 2's checkpoint and step 3's generation.
        last = next(m for m in metrics(run.run_dir) if m.get("step") == 2)
        gen = float(last.get("time/generate", last.get("time/wait_buffer", 0.0)))
        delay = 1.0 + gen + float(last["time/train"]) / 2
        time.sleep(delay)
        steps_at_kill = run.steps()
        run.kill(signal.SIGKILL)
        rec.detail = (
            f"killed {delay:.1f}s after step 2 (its generate {gen:.1f}s, update "
            f"{last['time/train']:.1f}s); steps logged then: {steps_at_kill}"
        )
        assert steps_at_kill == [1, 2], f"the kill came too late: {rec.detail}"
        rec.leaks = watch.leaks()
        t0 = time.monotonic()
        resumed = TrainProc(
            [f"steps={STEPS}", "--resume", str(run.run_dir)], run.run_dir, watch.case_id, ".2"
        )
        watch.own(resumed.pid)
        resumed.wait_step(STEPS, timeout=400)  # the step the kill interrupted, trained again
        rec.recovery_s = round(time.monotonic() - t0, 1)
        rc = resumed.wait(timeout=400)
        out = resumed.output()
        assert rc == 0, out[-4000:]
        acc = account(run.run_dir)
        steps = [m["step"] for m in metrics(run.run_dir) if m.get("kind", "train") == "train"]
        rec.episodes_lost = acc.lost * 2  # group_size episodes per task
        rec.duplicated = acc.duplicated * 2
        rec.steps_lost = len(set(range(1, STEPS + 1)) - set(steps))
        rec.leaks += watch.leaks()
        rec.outcome = "resumed" if (rc == 0 and not acc.lost and not acc.duplicated) else "failed"
        assert "resumed" in out and "at step 2" in out, out[-3000:]
        assert acc.duplicated == 0 and acc.lost == 0, acc
        assert sorted(acc.per_step) == list(range(1, STEPS + 1)), acc.per_step
        assert steps == list(range(1, STEPS + 1)), f"train lines of metrics.jsonl: {steps}"
        assert not rec.leaks, rec.leaks
    finally:
        rec.write()
        watch.clean()
