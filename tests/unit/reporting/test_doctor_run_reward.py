"""``agentrl doctor reward`` and ``agentrl doctor run`` end to end, and early-stop rules."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl import Env, Message, StepResult
from agentrl.cli.app import app
from agentrl.config import ConfigError, load_config
from agentrl.envs.retool import RetoolEnv
from agentrl.reporting.early_stop import EarlyStop, RunWatch, parse_rule
from agentrl.reporting.run_dir import RunDir
from agentrl.testing.reward_probe import probe_reward, probe_texts
from agentrl.types import Action

TASKS = [
    {"id": "t1", "prompt": "2+2?", "answer": "4"},
    {"id": "t2", "prompt": "3·3?", "answer": "9"},
]


class LenientEnv(Env):
    """A gameable scorer: 1 for the right answer anywhere, 0.5 for any 'Answer:' line."""

    def reset(self, task, *, seed=None):
        self.answer = task["answer"]
        return [Message.user(task["prompt"])]

    def step(self, action: Action) -> StepResult:
        text = action.text
        if f"Answer: {self.answer}" in text:
            return StepResult(reward=1.0, terminated=True)
        return StepResult(reward=0.5 if "Answer:" in text else 0.0, terminated=True)


def test_probe_texts() -> None:
    t = probe_texts("42", "\\boxed{ANSWER}")
    assert t["empty"] == "" and t["format_empty"] == "\\boxed{}"
    assert t["format_only"] == "\\boxed{0}" and t["correct"] == "\\boxed{42}"
    assert t["correct_in_padding"].count("\\boxed{42}") == 1 and len(t["correct_in_padding"]) > 500
    with pytest.raises(ValueError, match="ANSWER"):
        probe_texts("42", "\\boxed{}")


def test_a_format_only_reward_is_flagged() -> None:
    rep = asyncio.run(probe_reward(LenientEnv, TASKS, answer_format="Answer: ANSWER"))
    assert rep.scores["correct"] == [1.0, 1.0] and rep.scores["correct_in_padding"] == [1.0, 1.0]
    assert rep.scores["format_only"] == [0.5, 0.5] and rep.scores["format_empty"] == [0.5, 0.5]
    assert rep.scores["empty"] == [0.0, 0.0]
    assert len(rep.flags) == 2 and all("is rewarded" in f for f in rep.flags)


def test_retool_scorer_is_sound_and_its_format_reward_is_flagged() -> None:
    # The real retool env: \boxed{4} scores 1, everything else 0; with format_reward=0.1 a
    # boxed wrong answer earns 0.1, which is a red flag.
    rows = RetoolEnv.default_tasks(split="test", n=2, seed=0)
    rep = asyncio.run(probe_reward(RetoolEnv, rows, answer_format="\\boxed{ANSWER}"))
    assert rep.flags == [] and rep.scores["correct"] == [1.0, 1.0]
    assert rep.scores["empty"] == rep.scores["format_only"] == [0.0, 0.0]
    rep = asyncio.run(
        probe_reward(
            RetoolEnv, rows, env_kwargs={"format_reward": 0.1}, answer_format="\\boxed{ANSWER}"
        )
    )
    assert rep.scores["format_only"] == [0.1, 0.1]
    assert rep.flags and "format-only" in rep.flags[0]
    # Without the format the correct answer is invisible: flagged too.
    rep = asyncio.run(probe_reward(RetoolEnv, rows))
    assert any("does not see it" in f for f in rep.flags)


def test_doctor_reward_cli() -> None:
    ok = CliRunner().invoke(
        app, ["doctor", "reward", "--env", "retool", "--n", "1", "--format", "\\boxed{ANSWER}"]
    )
    assert ok.exit_code == 0, ok.output
    assert "ok: no red flag" in ok.output
    bad = CliRunner().invoke(
        app,
        ["doctor", "reward", "--env", "retool", "--n", "1", "--format", "\\boxed{ANSWER}",
         "--env-kwargs", json.dumps({"format_reward": 0.1})],
    )  # fmt: skip
    assert bad.exit_code == 1 and "RED FLAG" in bad.output


def test_doctor_run_cli(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    for step in range(1, 11):
        run.log(step, {"reward/mean": 0.3, "kl/ref_kl": 3.0 if step >= 4 else 0.05})
    out = CliRunner().invoke(app, ["doctor", "run", str(tmp_path)])
    text = " ".join(out.output.split())  # rich wraps long lines
    assert out.exit_code == 1
    assert "step 4: kl_high" in text and "levers:" in text and "1 red flag(s)" in text
    healthy = tmp_path / "healthy"
    run = RunDir(healthy)
    for step in range(1, 11):
        run.log(step, {"reward/mean": 0.3 + 0.01 * step, "kl/ref_kl": 0.05})
    out = CliRunner().invoke(app, ["doctor", "run", str(healthy)])
    text = " ".join(out.output.split())
    assert out.exit_code == 0 and "0 red flag(s)" in text
    # No eval rows, entropy, clip … in this stream: those rules say they were not checked.
    assert "not checked (metrics absent): zero_std_groups, entropy_plummet" in text
    assert "kl_high" not in text
    missing = CliRunner().invoke(app, ["doctor", "run", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "metrics.jsonl" in "".join(missing.output.split())


def test_early_stop_rules() -> None:
    r = parse_rule("kl > 2 for 20 steps")
    assert (r.keys, r.op, r.value, r.steps) == (("kl/ref_kl", "kl/ref_kl_old"), ">", 2.0, 20)
    assert parse_rule("actor/entropy<=0.05").steps == 1
    with pytest.raises(ValueError, match="METRIC OP VALUE"):
        parse_rule("kl is big")
    # entropy < 0.05 for 3 steps: steps 2, 3 low, 4 high (streak broken), 5, 6, 7 low → 7.
    stop = EarlyStop(["entropy < 0.05 for 3 steps", "kl > 2 for 20 steps"])
    ent = {1: 0.5, 2: 0.01, 3: 0.01, 4: 0.5, 5: 0.02, 6: 0.03, 7: 0.04, 8: 0.01}
    got = [stop.update(s, {"actor/entropy": e, "kl/ref_kl": 0.1}) for s, e in ent.items()]
    assert got[:6] == [None] * 6
    assert got[6] == "entropy < 0.05 for 3 steps: actor/entropy = 0.04 at step 7 (since step 5)"
    assert got[7] == got[6]  # the first reason stays


def test_early_stop_in_the_run_config() -> None:
    cfg = load_config(None, ['early_stop=["kl > 2 for 20 steps", "entropy < 0.05 for 10 steps"]'])
    assert cfg.early_stop == ["kl > 2 for 20 steps", "entropy < 0.05 for 10 steps"]
    with pytest.raises(ConfigError, match="early_stop rule 'kl >> 2' does not parse"):
        load_config(None, ['early_stop=["kl >> 2"]'])


def test_run_watch_prints_flags_once_and_stops() -> None:
    said: list[str] = []
    watch = RunWatch(["kl > 2 for 2 steps"], said.append)
    stops = [watch.step(s, {"reward/mean": 0.3, "kl/ref_kl": 3.0 if s >= 3 else 0.1})
             for s in range(1, 7)]  # fmt: skip
    assert stops == [False, False, False, True, False, False]
    assert watch.reason == "kl > 2 for 2 steps: kl/ref_kl = 3 at step 4 (since step 3)"
    flags = [m for m in said if m.startswith("[red flag]")]
    assert len(flags) == 1 and "step 3: kl_high" in flags[0]
    assert said[-1].startswith("early stop after step 4")
