"""Discarded episodes are accounted for: counted, saved with their tracebacks, shown, and a
run whose every episode breaks step after step stops with one message (issue #37).

The real ``drive`` loop with an in-process policy (ScriptedLLM) and a recording trainer;
the training env breaks on the steps a schedule names (its reset raises), the held-out
env is healthy unless a test says otherwise.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from agentrl import Env, StepResult
from agentrl.config import OrchestrationConfig, load_config
from agentrl.errors import ComponentError
from agentrl.orchestration.driver import Driver
from agentrl.orchestration.run import drive
from agentrl.orchestration.startup import Prepared, loop_config
from agentrl.orchestration.tasks import TaskStream
from agentrl.orchestration.training import AllDiscardedError
from agentrl.reporting.doctor import diagnose, read_metrics
from agentrl.reporting.run_dir import RunDir, read_discarded
from agentrl.rollout import AgentLoop, RolloutRunner
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy

TASKS = [{"id": f"t{i}"} for i in range(32)]


class Schedule:
    """Which training steps break: read by the env, advanced by the trainer."""

    def __init__(self, broken: set[int]) -> None:
        self.broken = broken
        self.trained = 0  # steps the trainer finished; the episodes running are for the next


def broken_env(schedule: Schedule) -> type[Env]:
    class StepwiseEnv(Env):
        """One turn, reward 0/1 by a seeded coin; reset raises on the scheduled steps."""

        def reset(self, task, *, seed=None):
            step = schedule.trained + 1
            if step in schedule.broken:
                raise RuntimeError(f"reset broke on step {step} for task {task['id']} [code 7]")
            self.rng = random.Random(seed)
            return f"task {task['id']}"

        def step(self, action):
            return StepResult(reward=float(self.rng.random() < 0.5), terminated=True)

    return StepwiseEnv


class HealthyEnv(Env):
    def reset(self, task, *, seed=None):
        return f"task {task['id']}"

    def step(self, action):
        return StepResult(reward=1.0, terminated=True)


class BrokenEvalEnv(Env):
    def reset(self, task, *, seed=None):
        raise ConnectionError("the eval sandbox is down")

    def step(self, action):
        raise AssertionError("never reached")


class Trainer:
    """Counts steps (advancing the schedule), records batch sizes and checkpoint extras."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.batches: list[int] = []
        self.checkpoints: list[dict[str, Any]] = []
        self.saved_hf = False

    def step(self, trajectories):
        self.batches.append(len(trajectories))
        self.schedule.trained += 1
        # A real trainer reports reward/mean 0.0 for an empty batch: the driver drops it.
        return {"reward/mean": sum(t.reward for t in trajectories) / max(len(trajectories), 1)}

    def state_dict_for_inference(self):
        return {"w": len(self.batches)}

    def save_checkpoint(self, root, extra=None):
        self.checkpoints.append(dict(extra or {}))
        path = Path(root) / f"step_{len(self.batches)}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def save_hf(self, path):
        self.saved_hf = True
        Path(path).mkdir(parents=True, exist_ok=True)


def run(
    tmp: Path,
    tokenizer,
    *,
    broken: set[int],
    steps: int,
    limit: int,
    eval_env: type[Env] = HealthyEnv,
    mode: str = "sync",
) -> tuple[Any, list[str], Trainer]:
    """Runs ``drive``; returns (RunResult or the exception raised, said lines, trainer)."""
    cfg = load_config(
        None,
        [f"steps={steps}", "eval.every=0", "eval.num_tasks=2", "wandb=disabled",
         "save_every=100", "rollout.group_size=2", "rollout.tasks_per_step=2",
         f"orchestration.mode={mode}", f"orchestration.max_all_discarded_steps={limit}"],
    )  # fmt: skip
    schedule = Schedule(broken)
    env = broken_env(schedule)
    prep = Prepared(
        cfg, env, eval_env, TASKS, TASKS[:2], "unused", tokenizer, RunDir(tmp), loop_config(cfg)
    )
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "ok"))
    runner = RolloutRunner(AgentLoop(llm, tokenizer, prep.loop_config), env, group_size=2)
    trainer = Trainer(schedule)

    async def push(weights, mode):
        llm.weight_version += 1
        return llm.weight_version

    said: list[str] = []
    coro = drive(
        prep, runner=runner, trainer=trainer, llm=llm, push=push, resume=False, say=said.append
    )
    try:
        result: Any = asyncio.run(coro)
    except ComponentError as e:
        result = e
    return result, said, trainer


def train_rows(tmp: Path) -> list[dict[str, Any]]:
    return [m for m in RunDir(tmp).metrics() if m["kind"] == "train"]


# ------------------------------------------------------------------ the driver's counts


# Groups a step takes: sync and one_step_off take tasks_per_step (2); fully_async keeps
# taking until the staleness bound lets no more start: (0 pushed + 1 + max_staleness 1) × 2.
@pytest.mark.parametrize(("mode", "groups"), [("sync", 2), ("one_step_off", 2), ("fully_async", 4)])
async def test_the_driver_hands_over_discarded_episodes_with_reason_and_traceback(
    tokenizer, mode, groups
):
    schedule = Schedule({1, 2, 3})  # every episode of the run breaks
    env = broken_env(schedule)
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "ok"))
    runner = RolloutRunner(AgentLoop(llm, tokenizer), env, group_size=2)
    trainer = Trainer(schedule)

    async def sync(weights, pause_mode):
        return 0

    driver = Driver(
        runner, trainer, sync, TaskStream(TASKS, seed=0), OrchestrationConfig(mode=mode),
        tasks_per_step=2,
    )  # fmt: skip
    outs = await asyncio.wait_for(_steps(driver, 1), 60)  # fully_async used to hang here
    (out,) = outs
    # groups × 2 episodes, all broken in reset: all discarded, none trained.
    assert out.trajectories == [] and trainer.batches == [0]
    assert [r for r, _ in out.discarded] == ["env_error"] * 2 * groups
    for _, t in out.discarded:
        assert t.stop_reason == "env_error"
        assert "Traceback (most recent call last)" in t.error
        assert t.error.rstrip().endswith(
            f"RuntimeError: reset broke on step 1 for task {t.task_id} [code 7]"
        )
    m = out.metrics
    assert m["episodes/generated"] == m["episodes/discarded"] == 2 * groups
    assert m["discard/episode:env_error"] == 2 * groups
    assert m["discard/group:too_few_episodes"] == groups
    # Statistics of an empty batch are not measurements: no "reward 0.000".
    assert "reward/mean" not in m


async def _steps(driver, n):
    return [o async for o in await driver.run(n)]


async def test_fully_async_keeps_stepping_when_every_episode_breaks(tokenizer):
    # Before, the step waited forever for a kept group the staleness bound let no one start.
    schedule = Schedule(set(range(1, 10)))
    env = broken_env(schedule)
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "ok"))
    runner = RolloutRunner(AgentLoop(llm, tokenizer), env, group_size=2)
    trainer = Trainer(schedule)

    async def sync(weights, pause_mode):
        llm.weight_version += 1
        return llm.weight_version

    for overlap in (True, False):
        driver = Driver(
            runner, trainer, sync, TaskStream(TASKS, seed=0),
            OrchestrationConfig(mode="fully_async", overlap_push=overlap), tasks_per_step=2,
        )  # fmt: skip
        outs = await asyncio.wait_for(_steps(driver, 3), 60)
        assert [o.step for o in outs] == [1, 2, 3]
        assert all(o.metrics["episodes/generated"] > 0 for o in outs)
        assert all(o.metrics["episodes/discarded"] == o.metrics["episodes/generated"] for o in outs)


# ------------------------------------------------------------------ the run directory


def test_discarded_episodes_are_saved_with_reason_and_traceback(tmp_path, tokenizer):
    # Step 1 breaks, step 2 is healthy, step 3 breaks; never stop.
    result, _, trainer = run(tmp_path, tokenizer, broken={1, 3}, steps=3, limit=0)
    assert result.steps_done == 3 and trainer.batches == [0, 4, 0]
    for step in (1, 3):
        items = read_discarded(tmp_path / "discarded" / f"step_{step:06d}.parquet")
        assert len(items) == 4
        for reason, t in items:
            assert reason == "env_error" and t.stop_reason == "env_error"
            assert "Traceback (most recent call last)" in t.error
            assert (
                f"RuntimeError: reset broke on step {step} for task {t.task_id} [code 7]" in t.error
            )
    # A step with no discarded episode has no file; its trained episodes are where they were.
    assert not (tmp_path / "discarded" / "step_000002.parquet").exists()
    assert sorted(p.name for p in (tmp_path / "discarded").iterdir()) == [
        "step_000001.parquet",
        "step_000003.parquet",
    ]
    rows = train_rows(tmp_path)
    assert [(r["episodes/generated"], r["episodes/discarded"]) for r in rows] == [
        (4, 4), (4, 0), (4, 4)
    ]  # fmt: skip
    assert ["reward/mean" in r for r in rows] == [False, True, False]


def test_the_inspector_lists_discarded_episodes_after_the_trained_ones(tmp_path, tokenizer):
    from agentrl.inspector.data import EpisodeFilter, RunData

    run(tmp_path, tokenizer, broken={1}, steps=2, limit=0)
    data = RunData(tmp_path)
    assert data.steps() == [1, 2] and data.num_episodes(1) == 4 and data.num_episodes(2) == 4
    (one, two) = (data.summaries(1), data.summaries(2))
    assert [(s["index"], s["discarded"], s["discard_reason"], s["error"]) for s in one] == [
        (i, True, "env_error", True) for i in range(4)
    ]
    assert [s["discarded"] for s in two] == [False] * 4
    t = data.trajectory(1, 3)
    assert t.stop_reason == "env_error" and "reset broke on step 1" in t.error
    total, _ = data.episodes(EpisodeFilter(stops=("env_error",)))
    assert total == 4
    with pytest.raises(KeyError):
        data.trajectory(1, 4)


# ------------------------------------------------------------------ the console


def test_the_first_traceback_is_printed_once_and_each_step_line_counts_discards(
    tmp_path, tokenizer, capsys
):
    result, said, _ = run(tmp_path, tokenizer, broken={1, 2, 3}, steps=3, limit=0)
    assert result.steps_done == 3
    firsts = [m for m in said if m.startswith("first discarded episode")]
    assert len(firsts) == 1  # three broken steps, one traceback
    (first,) = firsts
    saved = read_discarded(tmp_path / "discarded" / "step_000001.parquet")
    episode = saved[0][1]  # the first episode of the first broken group
    assert episode.episode_id.startswith("i0:0:")
    assert first.startswith(
        f"first discarded episode (step 1, episode {episode.episode_id}, env_error); "
        f"every discarded episode is saved with its error in {tmp_path / 'discarded'}/:\n"
    )
    assert "  Traceback (most recent call last):" in first
    assert first.endswith(
        f"  RuntimeError: reset broke on step 1 for task {episode.task_id} [code 7]"
    )
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith("step ")]
    assert [x.split(" | ")[:2] for x in lines] == [
        [f"step {s}/3", "discarded 4/4 (env_error 4)"] for s in (1, 2, 3)
    ]
    assert not any("reward" in x for x in lines)  # nothing was trained: no reward 0.000


def test_a_long_traceback_is_abridged(tmp_path, tokenizer):
    # 30 distinct frames (a recursion's repeated lines would be folded by traceback).
    frames: dict[str, Any] = {}
    src = "".join(f"def f{i}():\n    return f{i + 1}()\n" for i in range(30))
    exec(src + "def f30():\n    raise ValueError('bottom of a deep stack')\n", frames)

    class DeepEnv(Env):
        def reset(self, task, *, seed=None):
            return frames["f0"]()

        def step(self, action):
            raise AssertionError("never reached")

    cfg = load_config(
        None,
        ["steps=1", "eval.every=0", "eval.num_tasks=2", "wandb=disabled",
         "rollout.group_size=2", "rollout.tasks_per_step=1"],
    )  # fmt: skip
    prep = Prepared(
        cfg, DeepEnv, HealthyEnv, TASKS, TASKS[:2], "unused", tokenizer, RunDir(tmp_path),
        loop_config(cfg),
    )  # fmt: skip
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "ok"))
    runner = RolloutRunner(AgentLoop(llm, tokenizer, prep.loop_config), DeepEnv, group_size=2)

    async def push(weights, mode):
        return 0

    said: list[str] = []
    asyncio.run(
        drive(prep, runner=runner, trainer=Trainer(Schedule(set())), llm=llm, push=push,
              resume=False, say=said.append)
    )  # fmt: skip
    (first,) = [m for m in said if m.startswith("first discarded episode")]
    (_, t), *_ = read_discarded(tmp_path / "discarded" / "step_000001.parquet")
    full = t.error.rstrip().splitlines()
    assert len(full) > 40  # 31 frames of f0 … f30, one line each, and the env call's
    body = first.splitlines()[1:]
    # 24 lines: the first 3, a line saying how many were left out, the last 20.
    assert len(body) == 24
    assert body[:3] == [f"  {x}" for x in full[:3]]
    assert body[3] == f"  … ({len(full) - 23} lines left out) …"
    assert body[4:] == [f"  {x}" for x in full[-20:]]
    assert body[-1] == "  ValueError: bottom of a deep stack"


# ------------------------------------------------------------------ the stop


STOP = "the run stopped after step 3: every episode of the last 3 steps (1-3) was discarded"


def test_the_run_stops_after_n_consecutive_all_discarded_steps(tmp_path, tokenizer):
    err, said, trainer = run(tmp_path, tokenizer, broken=set(range(1, 11)), steps=10, limit=3)
    assert isinstance(err, AllDiscardedError)
    msg = str(err)
    first = read_discarded(tmp_path / "discarded" / "step_000001.parquet")[0][1]
    assert msg == (
        f"{STOP}, so nothing was trained (12 episodes: env_error 12); first error (step 1, "
        f"episode {first.episode_id}, env_error): RuntimeError: reset broke on step 1 for task "
        f"{first.task_id} [code 7]; every discarded episode is saved with its traceback in "
        f"{tmp_path}/discarded/ (agentrl view {tmp_path} --web lists them); this stop is "
        f"orchestration.max_all_discarded_steps=3 (0: never stop); checkpoint of step 3 saved "
        f"(once the cause is fixed, continue with --resume {tmp_path})"
    )
    # Three steps ran, not ten; a consistent run dir: the metrics, the discarded episodes of
    # each step and a checkpoint of step 3 that records why; no final eval, no final model.
    assert trainer.batches == [0, 0, 0]
    assert [r["step"] for r in train_rows(tmp_path)] == [1, 2, 3]
    assert [p.name for p in sorted((tmp_path / "discarded").iterdir())] == [
        f"step_00000{s}.parquet" for s in (1, 2, 3)
    ]
    assert trainer.checkpoints[-1]["run"]["step"] == 3
    assert trainer.checkpoints[-1]["run"]["failed"].startswith(STOP)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["failed"].startswith(STOP)
    assert summary["eval_after"] == {} and not trainer.saved_hf
    assert [m.startswith("eval @ step") for m in said].count(True) == 1  # only the one before
    # The red flag was printed live, once, at the first such step.
    flags = [m for m in said if m.startswith("[red flag]")]
    assert len(flags) == 1 and flags[0].startswith("[red flag] step 1: all_discarded")


def test_the_cli_prints_the_stop_as_one_error_and_exits_2(tmp_path, tokenizer, monkeypatch):
    from typer.testing import CliRunner

    import agentrl.orchestration.run as run_module
    from agentrl.cli.app import app

    def fake_train_from_cli(config, overrides, resume, say):
        err, _, _ = run(tmp_path, tokenizer, broken={1, 2}, steps=5, limit=2)
        raise err

    monkeypatch.setattr(run_module, "train_from_cli", fake_train_from_cli)
    out = CliRunner().invoke(app, ["train"])
    text = " ".join(out.output.split())
    assert out.exit_code == 2, out.output
    # The step lines, then the one error (no traceback: the first one was printed by say).
    assert text.startswith("step 1/5 | discarded 4/4 (env_error 4)")
    error = text[text.index("error: ") :]
    assert error.startswith("error: the run stopped after step 2: every episode of the last 2")
    assert error.endswith(f"continue with --resume {tmp_path})")
    assert "orchestration.max_all_discarded_steps=2" in error and "Traceback" not in text
    assert "[code 7]; every discarded episode" in error  # the error's text, not markup


def test_n_minus_1_all_discarded_steps_do_not_stop_the_run(tmp_path, tokenizer):
    result, _, trainer = run(tmp_path, tokenizer, broken={1, 2}, steps=3, limit=3)
    assert result.steps_done == 3 and result.early_stop is None and not result.interrupted
    assert trainer.batches == [0, 0, 4] and trainer.saved_hf
    assert "failed" not in json.loads((tmp_path / "summary.json").read_text())


def test_a_step_with_a_kept_episode_resets_the_count(tmp_path, tokenizer):
    # limit 2: 1 broken, 2 healthy (resets), 3 broken, 4 broken → stops after step 4.
    err, _, trainer = run(tmp_path, tokenizer, broken={1, 3, 4, 5, 6}, steps=8, limit=2)
    assert isinstance(err, AllDiscardedError)
    assert str(err).startswith(
        "the run stopped after step 4: every episode of the last 2 steps (3-4) was discarded, "
        "so nothing was trained (8 episodes: env_error 8); first error (step 1, "
    )
    assert trainer.batches == [0, 4, 0, 0]


def test_zero_never_stops(tmp_path, tokenizer):
    result, _, trainer = run(tmp_path, tokenizer, broken=set(range(1, 6)), steps=5, limit=0)
    assert result.steps_done == 5 and trainer.batches == [0] * 5


def test_doctor_run_flags_the_all_discarded_steps(tmp_path, tokenizer):
    run(tmp_path, tokenizer, broken={2, 3}, steps=4, limit=0)
    flags = diagnose(read_metrics(tmp_path))
    assert [(f.name, f.step) for f in flags] == [("all_discarded", 2)]
    assert flags[0].failure_mode == "broken_episodes"
    assert flags[0].detail == (
        "every episode of the step was discarded (4 of 4: env_error 4); 2 such steps, the "
        "last at step 3"
    )
    healthy = tmp_path / "healthy"
    run(healthy, tokenizer, broken=set(), steps=2, limit=0)
    assert diagnose(read_metrics(healthy)) == []


# ------------------------------------------------------------------ the evaluation


def test_an_evaluation_whose_episodes_all_broke_is_not_a_result(tmp_path, tokenizer):
    from agentrl.cli.app import eval_summary

    result, said, _ = run(
        tmp_path, tokenizer, broken=set(), steps=1, limit=3, eval_env=BrokenEvalEnv
    )
    # 2 held-out tasks × 1 sample, both broken in reset: counted, saved, printed as such.
    assert result.eval_before["episodes"] == 2 and result.eval_before["discarded"] == 2
    assert result.eval_before["stop/env_error"] == 2
    evals = [m for m in said if m.startswith("eval @ step")]
    assert evals == [
        "eval @ step 0: success not measured: all 2 evaluation episodes were discarded "
        "(env_error 2)",
        "eval @ step 1: success not measured: all 2 evaluation episodes were discarded "
        "(env_error 2)",
    ]
    for name in ("eval_000000.parquet", "eval_000001.parquet"):
        items = read_discarded(tmp_path / "discarded" / name)
        assert [r for r, _ in items] == ["env_error", "env_error"]
        assert all("ConnectionError: the eval sandbox is down" in t.error for _, t in items)
    # The first traceback of the run is the evaluation's (it ran first).
    (first,) = [m for m in said if m.startswith("first discarded episode")]
    assert first.startswith("first discarded episode (eval @ step 0, episode ")
    line = eval_summary(result.eval_before, result.eval_after, result.steps_done)
    assert line == (
        "held-out success: not measured after 1 steps: all 2 evaluation episodes were "
        "discarded (env_error 2); their errors are in the run directory's discarded/; "
        "before training: not measured either, all 2 evaluation episodes were discarded "
        "(env_error 2)"
    )
    assert "0.000" not in line
