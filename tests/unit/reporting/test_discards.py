"""Discarded episodes as the run reports them: the files, the step line, the first traceback,
the stop after N all-discarded steps, the red flag and the evaluation lines (issue #37)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from agentrl.reporting.discards import (
    DiscardLog,
    abridge,
    all_discarded,
    eval_line,
    held_out_line,
    last_line,
)
from agentrl.reporting.doctor import diagnose
from agentrl.reporting.early_stop import RunWatch
from agentrl.reporting.progress import ProgressLog
from agentrl.reporting.run_dir import RunDir, read_discarded, read_trajectories
from agentrl.types import StopReason, Trajectory
from tests.helpers.trajectories import per_turn_trajectory

TRACE = (
    "Traceback (most recent call last):\n"
    '  File "agent.py", line 3, in solve\n'
    "    await client.responses.create(...)\n"
    "openai.NotFoundError: Error code: 404\n"
)


def broken(episode_id: str, reason: StopReason = StopReason.AGENT_ERROR, error=TRACE):
    return Trajectory(
        task_id="t", group_id="g", episode_id=episode_id, stop_reason=reason, error=error
    )


def all_broken_step(n: int = 4, reason: str = "agent_error") -> dict[str, float]:
    """A step's metrics as the driver writes them when all n episodes broke."""
    return {
        "episodes/generated": float(n),
        "episodes/discarded": float(n),
        f"discard/episode:{reason}": float(n),
        "discard/group:too_few_episodes": n / 2,
    }


KEPT_STEP = {"episodes/generated": 4.0, "episodes/discarded": 3.0, "reward/mean": 1.0,
             "discard/episode:agent_error": 3.0}  # fmt: skip


# ------------------------------------------------------------------ the files


def test_discarded_episodes_round_trip_with_their_reasons(tmp_path: Path):
    run = RunDir(tmp_path)
    items = [("agent_error", broken("g/0")), ("no_model_tokens", per_turn_trajectory())]
    path = run.save_discarded(2, items)
    assert path == tmp_path / "discarded" / "step_000002.parquet"
    assert read_discarded(path) == items
    # The same file reads as plain trajectories too (the extra column is ignored).
    assert read_trajectories(path) == [t for _, t in items]
    assert run.save_discarded(0, items[:1], evaluation=True) == (
        tmp_path / "discarded" / "eval_000000.parquet"
    )
    # A step logged again (after a resume) without discards leaves no stale file.
    assert run.save_discarded(2, []) is None and not path.exists()
    # The trained episodes' files are as before: no discard column.
    kept = run.save_trajectories(2, [per_turn_trajectory()])
    import pyarrow.parquet as pq

    assert "discard_reason" not in pq.read_schema(kept).names


def test_no_discarded_directory_without_discards(tmp_path: Path):
    run = RunDir(tmp_path)
    assert run.save_discarded(1, []) is None
    assert not (tmp_path / "discarded").exists()


# ------------------------------------------------------------------ the console


def test_the_step_line_counts_discarded_episodes_by_reason(tmp_path: Path):
    out = io.StringIO()
    log = ProgressLog(10, tmp_path, wandb_mode="disabled", console=Console(file=out, width=200))
    log.step(1, {**all_broken_step(4), "discard/episode:env_error": 0.0})
    log.step(2, {"episodes/generated": 8.0, "episodes/discarded": 3.0, "reward/mean": 0.5,
                 "discard/episode:env_error": 1.0, "discard/episode:agent_error": 2.0})  # fmt: skip
    log.step(3, {"episodes/generated": 8.0, "episodes/discarded": 0.0, "reward/mean": 0.5})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step 1/10 | discarded 4/4 (agent_error 4) | eta")
    assert lines[1].startswith(
        "step 2/10 | discarded 3/8 (agent_error 2, env_error 1) | reward 0.500 | eta"
    )
    assert lines[2].startswith("step 3/10 | reward 0.500 | eta")  # none discarded: no part


def test_abridge_keeps_the_head_and_the_end():
    text = "\n".join(f"line {i}" for i in range(50))
    short = abridge(text, max_lines=10)
    assert short.splitlines() == [
        "line 0", "line 1", "line 2", "… (41 lines left out) …",
        "line 44", "line 45", "line 46", "line 47", "line 48", "line 49",
    ]  # fmt: skip
    assert abridge("a\nb\n", max_lines=10) == "a\nb"
    assert abridge("x" * 500, width=10) == "x" * 9 + "…"
    assert last_line(TRACE) == "openai.NotFoundError: Error code: 404"
    assert last_line(None) == "(no error text recorded)"


def test_the_first_traceback_is_said_once():
    said: list[str] = []
    log = DiscardLog(said.append)
    # Discards without an error text (no model token) do not use up the one print.
    log.episodes("step 1", [("no_model_tokens", broken("a/0", StopReason.MAX_TOKENS, None))])
    assert said == []
    log.episodes("step 2", [("agent_error", broken("b/0")), ("llm_error", broken("b/1"))],
                 Path("/runs/r/discarded/step_000002.parquet"))  # fmt: skip
    log.episodes("step 3", [("agent_error", broken("c/0"))])
    assert said == [
        "first discarded episode (step 2, episode b/0, agent_error); every discarded episode "
        "is saved with its error in /runs/r/discarded/:\n"
        "  Traceback (most recent call last):\n"
        '    File "agent.py", line 3, in solve\n'
        "      await client.responses.create(...)\n"
        "  openai.NotFoundError: Error code: 404"
    ]


# ------------------------------------------------------------------ the stop


def test_all_discarded_needs_episodes_and_every_one_discarded():
    assert all_discarded(all_broken_step(4))
    assert not all_discarded(KEPT_STEP)
    assert not all_discarded({"episodes/generated": 0.0, "episodes/discarded": 0.0})
    assert not all_discarded({"reward/mean": 0.0})  # a run from before these metrics


def test_the_stop_comes_after_n_consecutive_all_discarded_steps_not_before():
    log = DiscardLog(lambda _: None, max_all_discarded_steps=3)
    log.episodes("step 1", [("agent_error", broken("i0:0:t3/0"))])
    assert log.step(1, all_broken_step()) is None
    assert log.step(2, all_broken_step()) is None  # N-1 = 2 steps: no stop
    msg = log.step(3, all_broken_step(4, "llm_error"))
    assert msg == (
        "the run stopped after step 3: every episode of the last 3 steps (1-3) was discarded, "
        "so nothing was trained (12 episodes: agent_error 8, llm_error 4); first error (step 1, "
        "episode i0:0:t3/0, agent_error): openai.NotFoundError: Error code: 404; every "
        "discarded episode is saved with its traceback in RUN_DIR/discarded/ (agentrl view "
        "RUN_DIR --web lists them); this stop is orchestration.max_all_discarded_steps=3 "
        "(0: never stop)"
    )
    assert log.stop_message == msg and log.step(4, all_broken_step()) is None  # said once


def test_a_step_with_a_kept_episode_resets_the_streak():
    log = DiscardLog(lambda _: None, max_all_discarded_steps=2)
    assert log.step(1, all_broken_step()) is None
    assert log.step(2, KEPT_STEP) is None  # 3 of 4 discarded, one trained: reset
    assert log.step(3, all_broken_step()) is None
    msg = log.step(4, all_broken_step())
    assert msg is not None and msg.startswith(
        "the run stopped after step 4: every episode of the last 2 steps (3-4) was discarded, "
        "so nothing was trained (8 episodes: agent_error 8); no error text was recorded;"
    )


def test_zero_never_stops():
    log = DiscardLog(lambda _: None, max_all_discarded_steps=0)
    assert all(log.step(s, all_broken_step()) is None for s in range(1, 50))
    assert log.streak == 49


def test_the_run_watch_flags_once_and_stops_at_n():
    said: list[str] = []
    watch = RunWatch([], said.append, max_all_discarded_steps=2, run_dir=Path("/runs/r"))
    assert watch.step(1, all_broken_step()) is False
    flags = [m for m in said if m.startswith("[red flag]")]
    assert len(flags) == 1 and flags[0].startswith(
        "[red flag] step 1: all_discarded: every episode of the step was discarded "
        "(4 of 4: agent_error 4)\n  failure mode: broken episodes"
    )
    assert watch.failed is None and watch.step(2, all_broken_step()) is True
    assert watch.failed is not None and "/runs/r/discarded/" in watch.failed
    assert watch.reason is None  # not an early_stop rule
    assert len([m for m in said if m.startswith("[red flag]")]) == 1  # printed once


# ------------------------------------------------------------------ agentrl doctor run


def test_doctor_run_flags_a_step_where_every_episode_was_discarded():
    rows = [{"step": 1, "kind": "train", **KEPT_STEP},
            {"step": 2, "kind": "train", **all_broken_step(4)},
            {"step": 3, "kind": "train", **KEPT_STEP},
            {"step": 4, "kind": "train", **all_broken_step(6, "env_error")}]  # fmt: skip
    (flag,) = diagnose(rows)
    assert (flag.name, flag.step, flag.failure_mode) == ("all_discarded", 2, "broken_episodes")
    assert flag.detail == (
        "every episode of the step was discarded (4 of 4: agent_error 4); 2 such steps, the "
        "last at step 4"
    )
    assert any("max_all_discarded_steps" in lever for lever in flag.levers)
    assert diagnose(rows[:1] + rows[2:3]) == []  # 3 of 4 discarded is no flag


def test_an_eval_with_every_episode_discarded_is_no_baseline_for_held_out_success():
    # reward_up_heldout_flat compares held-out success with the first eval. An eval whose
    # episodes all broke (success 0.0 by default) is no measurement: left out, the first
    # real eval (0.3) is the baseline and 0.2 at step 20 is flat; counted, 0.0 would make
    # 0.2 look like progress and hide the flag.
    train = [{"step": s, "kind": "train", "reward/mean": 0.2 + 0.05 * s} for s in range(1, 21)]
    dead = {"step": 0, "kind": "eval", "success": 0.0, "episodes": 4.0, "discarded": 4.0}
    ok = {"kind": "eval", "episodes": 4.0, "discarded": 0.0}
    evals = [dead, {"step": 10, "success": 0.3, **ok}, {"step": 20, "success": 0.2, **ok}]
    (flag,) = diagnose(train + evals)
    assert (flag.name, flag.step) == ("reward_up_heldout_flat", 20)
    assert flag.detail.endswith("held-out success went 0.3 → 0.2")
    measured = {**dead, "discarded": 0.0}  # the same 0.0, measured: progress, no flag
    assert diagnose([*train, measured, *evals[1:]]) == []


# ------------------------------------------------------------------ the evaluation lines

DEAD = {"success": 0.0, "pass@1": 0.0, "episodes": 4.0, "discarded": 4.0,
        "stop/agent_error": 3.0, "stop/llm_error": 1.0}  # fmt: skip
PART = {"success": 0.5, "episodes": 4.0, "discarded": 1.0, "stop/env_error": 1.0,
        "stop/done": 3.0}  # fmt: skip
FINE = {"success": 0.25, "episodes": 4.0, "discarded": 0.0, "stop/done": 4.0}


def test_the_eval_line_says_not_measured_when_every_episode_was_discarded():
    assert eval_line(0, DEAD) == (
        "eval @ step 0: success not measured: all 4 evaluation episodes were discarded "
        "(agent_error 3, llm_error 1)"
    )
    assert eval_line(5, PART) == (
        "eval @ step 5: success 0.500; 1 of 4 evaluation episodes discarded (env_error 1), "
        "counted as not solved"
    )
    assert eval_line(5, FINE) == "eval @ step 5: success 0.250"
    assert eval_line(5, {"success": 0.25}) == "eval @ step 5: success 0.250"  # older results


def test_the_held_out_line():
    assert held_out_line(FINE, {**FINE, "success": 0.75}, 8) == (
        "held-out success: 0.250 → 0.750 (+0.500) after 8 steps"
    )
    assert held_out_line(DEAD, DEAD, 2) == (
        "held-out success: not measured after 2 steps: all 4 evaluation episodes were "
        "discarded (agent_error 3, llm_error 1); their errors are in the run directory's "
        "discarded/; before training: not measured either, all 4 evaluation episodes were "
        "discarded (agent_error 3, llm_error 1)"
    )
    assert held_out_line(FINE, DEAD, 2) == (
        "held-out success: not measured after 2 steps: all 4 evaluation episodes were "
        "discarded (agent_error 3, llm_error 1); their errors are in the run directory's "
        "discarded/; before training: 0.250"
    )
    assert held_out_line(DEAD, PART, 2) == (
        "held-out success: 0.500 after 2 steps (before training: not measured, all 4 "
        "evaluation episodes were discarded (agent_error 3, llm_error 1)); 1 of 4 evaluation "
        "episodes discarded (env_error 1), counted as not solved"
    )
    assert held_out_line(FINE, PART, 2) == (
        "held-out success: 0.250 → 0.500 (+0.250) after 2 steps; after: 1 of 4 evaluation "
        "episodes discarded (env_error 1), counted as not solved"
    )
    assert held_out_line({}, DEAD, 4).startswith("held-out success: not measured after 4 steps")
    for before, after in ((DEAD, DEAD), (FINE, DEAD), (DEAD, PART)):
        assert "0.000" not in held_out_line(before, after, 2)
