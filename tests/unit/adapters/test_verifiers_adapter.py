"""VerifiersEnv on a small offline verifiers 0.4 taskset (tests/data/verifiers_tasksets):
its tasks, prompts, scoring by the task's own ``@vf.reward`` methods, and its errors.

verifiers lives in an overlay (scripts/install-overlay-verifiers.sh: it pins openai<3, the
venv has openai 3), put on ``sys.path`` here and on ``PYTHONPATH`` for the subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl import Action, StopReason, ToolCall
from agentrl.loading.envs import EnvNotFoundError, resolve_env
from agentrl.rollout import AgentLoop
from agentrl.testing import check_env, check_env_on_tasks
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy

ROOT = Path(__file__).resolve().parents[3]
OVERLAY = Path(sys.prefix) / "overlays" / "verifiers"
TASKSETS = ROOT / "tests" / "data" / "verifiers_tasksets"
SPEC = "verifiers:agentrl-vf-arith"


@pytest.fixture(scope="module", autouse=True)
def verifiers_on_path() -> Iterator[None]:
    assert (OVERLAY / "verifiers").is_dir(), f"run scripts/install-overlay-verifiers.sh ({OVERLAY})"
    sys.path[:0] = [str(OVERLAY), str(TASKSETS)]
    try:
        yield
    finally:
        for p in (str(OVERLAY), str(TASKSETS)):
            sys.path.remove(p)


def act(text: str, **kw: object) -> Action:
    return Action(text=text, content=text, **kw)  # type: ignore[arg-type]


def test_the_tasksets_tasks_split_like_a_task_file() -> None:
    cls = resolve_env(SPEC)
    test, train = cls.default_tasks(split="test"), cls.default_tasks(split="train")
    assert [t["idx"] for t in test] == [0] and [t["idx"] for t in train] == list(range(1, 10))
    assert train[0] == {
        "idx": 1,
        "prompt": "What is 1 + 1? Answer with the number only.",
        "system_prompt": "You are a calculator.",
        "answer": "2",
    }
    assert len(cls.default_tasks(n=3)) == 3


async def test_a_reply_is_scored_by_the_tasks_own_rewards() -> None:
    env = resolve_env(SPEC)()
    row = env.default_tasks(n=1)[0]
    msgs = env.reset(row)
    assert [(m.role, m.content) for m in msgs] == [
        ("system", "You are a calculator."),
        ("user", "What is 1 + 1? Answer with the number only."),
    ]
    right = await env.step(act("2"))
    assert right.terminated and right.reward == 1.5  # correct (weight 1) + short (weight 0.5)
    assert right.metrics == {
        "verifiers/correct": 1.0,
        "verifiers/short": 1.0,
        "verifiers/turns": 1.0,
    }
    env.reset(row)
    wrong = await env.step(act("It is three."))
    assert wrong.terminated and wrong.reward == 0.0 and wrong.metrics["verifiers/correct"] == 0.0


async def test_a_turn_with_tool_calls_goes_on_until_a_plain_reply() -> None:
    env = resolve_env(SPEC)()
    env.reset(env.default_tasks(n=1)[0])
    call = ToolCall(name="calc", arguments={"x": "1+1"}, id="c1")
    going = await env.step(act("<tool_call>", tool_calls=(call,)))
    assert not going.terminated and going.reward == 0.0
    done = await env.step(act("2"))
    assert done.terminated and done.reward == 1.5 and done.metrics["verifiers/turns"] == 2.0
    env.reset(env.default_tasks(n=1)[0])
    last = await env.step(act("<tool_call>", tool_calls=(call,), last_turn=True))
    assert last.terminated  # the turn budget ends: scored now


async def test_an_episode_through_the_agent_loop(tokenizer) -> None:
    cls = resolve_env(SPEC)
    check_env(cls)
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "2"))
    traj = await AgentLoop(llm, tokenizer).run(cls(), cls.default_tasks(n=1)[0])
    assert traj.stop_reason == StopReason.DONE and traj.reward == 1.5, traj.error


def test_an_unknown_taskset_is_named() -> None:
    with pytest.raises(EnvNotFoundError, match="no verifiers taskset 'no-such-taskset'"):
        resolve_env("verifiers:no-such-taskset")


def agentrl(*args: str, pythonpath: str | None, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args],
        cwd=cwd, env={**env, "COLUMNS": "300"}, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def test_doctor_env_names_a_row_the_taskset_refuses(tmp_path: Path) -> None:
    rows = [{"prompt": "What is 1 + 1?", "answer": "2"}, {"prompt": "What is 2 + 2?"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = f"{OVERLAY}{os.pathsep}{TASKSETS}"
    r = agentrl("doctor", "env", "--env", SPEC, "--tasks", "rows.jsonl", pythonpath=path,
                cwd=tmp_path)  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out, out
    assert "tasks=rows.jsonl (line 2): field 'answer': Field required" in out, out
    (tmp_path / "rows.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert check_env_on_tasks(resolve_env(SPEC), str(tmp_path / "rows.jsonl")) == []


def test_without_verifiers_one_line_says_what_to_install(tmp_path: Path) -> None:
    r = agentrl("doctor", "env", "--env", SPEC, pythonpath=None, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "pip install 'agentrl[verifiers]'" in errors[0], out


def test_task_files_are_validated_as_the_tasksets_task_data(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cls = resolve_env(SPEC)
    rows = [{"prompt": "What is 1 + 1?", "answer": "2"}, {"prompt": "What is 2 + 2?"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    with pytest.raises(
        ValueError, match=r"rows.parquet \(row 1\): field 'answer': .* reads rows as ArithData"
    ):
        cls.load_tasks(str(tmp_path / "rows.parquet"))
    (tmp_path / "rows.json").write_text(json.dumps(rows[:1]))
    assert cls.load_tasks(str(tmp_path / "rows.json")) == [rows[0]]
