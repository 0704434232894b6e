"""SWE env bad input (issue #41), without Docker: tasks refused at load (too large, failing
validation, no engine), and an episode whose container dies discarded with its reason."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.envs.swe import GradeResult, SweEnv, SweTask, TaskFormatError, admission, workspace
from agentrl.errors import DockerUnavailableError
from agentrl.orchestration.driver import select_groups
from agentrl.rollout import AgentLoop, LoopConfig
from agentrl.sandbox.base import ExecResult, SandboxError, SandboxLimits
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy
from agentrl.types import StopReason
from tests.unit.envs.test_swe_tasks import GOLD, ROW


def _task(tid: str, **kw: Any) -> SweTask:
    return SweTask(
        id=tid,
        issue=ROW["issue"],
        gold_patch=GOLD,
        repo_files=kw.pop("repo_files", ROW["repo_files"]),
        hidden_tests=ROW["hidden_tests"],
        **kw,
    )


# ----------------------------------------------------------------------------- size


def test_a_snapshot_over_half_the_disk_is_refused_naming_task_size_and_setting() -> None:
    big = _task("big", repo_files={"m.py": "x = 1\n", "blob.txt": "x" * (600 << 10)})
    with pytest.raises(TaskFormatError) as e:
        admission.check_size(big, max_disk_mb=1)
    msg = str(e.value)
    assert "SWE task 'big'" in msg and "0.6 MiB" in msg and "0.5 MiB" in msg
    assert "limits.max_disk_mb=1" in msg
    admission.check_size(big, max_disk_mb=2)  # fits


def test_load_tasks_refuses_a_repository_larger_than_the_agent_container(tmp_path: Path) -> None:
    task = tmp_path / "huge"
    (task / "repo").mkdir(parents=True)
    (task / "repo" / "m.py").write_text("x = 1\n")
    with (task / "repo" / "data.bin").open("wb") as f:
        f.truncate(300 << 20)  # sparse: 300 MiB by size, nothing on disk
    (task / "hidden_tests" / "tests").mkdir(parents=True)
    (task / "hidden_tests" / "tests" / "test_m.py").write_text(
        ROW["hidden_tests"]["tests/test_m.py"]
    )
    (task / "gold.patch").write_text(GOLD)
    (task / "task.json").write_text(json.dumps({"issue": "x should be 2"}))
    with pytest.raises(TaskFormatError, match=r"SWE task 'huge': its snapshot holds 300\.0 MiB"):
        SweEnv.load_tasks(str(task), validate=False)


async def test_reset_refuses_a_too_large_task_before_any_container_starts() -> None:
    class NoContainer(SweEnv):
        async def _acquire(self, task: SweTask) -> Any:
            raise AssertionError("a container was started")

    env = NoContainer(limits=SandboxLimits(max_disk_mb=1))
    row = {**ROW, "repo_files": {"m.py": "x = 1\n", "blob.txt": "x" * (600 << 10)}}
    with pytest.raises(TaskFormatError, match=r"'t1'.*limits\.max_disk_mb=1"):
        await env.reset(row)


# ----------------------------------------------------------------------------- validation


class FakeGrader:
    """Gold passes unless the id says so; the empty patch fails unless the id says so."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    async def grade(self, task: SweTask, patch: str) -> GradeResult:
        gold = bool(patch)
        self.calls.append((task.id, gold))
        passed = ("gold-fails" not in task.id) if gold else ("empty-passes" in task.id)
        return GradeResult(float(passed), passed, True, 0 if passed else 1, detail="d")


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agentrl.sandbox.images.docker_client", lambda: object())


async def test_load_refuses_every_invalid_task_by_id_and_remembers_the_valid(
    engine: None, tmp_path: Path
) -> None:
    tasks = [_task("a-gold-fails"), _task("b-empty-passes"), _task("c-ok")]
    grader, cache = FakeGrader(), admission.ValidationCache(tmp_path)
    with pytest.raises(TaskFormatError) as e:
        admission.admit(tasks, max_disk_mb=512, validate=True, grader=grader, cache=cache)
    msg = str(e.value)
    assert msg.startswith("2 of 3 SWE tasks failed validation")
    assert "a-gold-fails: the gold patch does not pass the hidden tests" in msg
    assert "b-empty-passes: the empty patch passes the hidden tests" in msg
    assert "c-ok" not in msg and "AGENTRL_SWE_VALIDATE=0" in msg
    assert cache.has(tasks[2]) and not cache.has(tasks[0])

    grader.calls.clear()  # the next run grades only what it has not seen valid
    changed = dataclasses.replace(tasks[2], issue="another issue")
    assert admission.admit([tasks[2], changed], max_disk_mb=512, grader=grader, cache=cache)
    assert grader.calls == [(changed.id, True), (changed.id, False)]


async def test_validation_can_be_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    class Refuses(FakeGrader):
        async def grade(self, task: SweTask, patch: str) -> GradeResult:
            raise AssertionError("graded")

    monkeypatch.setenv(admission.SKIP_ENV, "0")
    cache = admission.ValidationCache(tmp_path)
    out = admission.admit([_task("x-gold-fails")], max_disk_mb=512, grader=Refuses(), cache=cache)
    assert [t.id for t in out] == ["x-gold-fails"]


def test_no_engine_at_load_is_one_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_engine() -> None:
        raise DockerUnavailableError("no Docker engine answers (refused)")

    monkeypatch.setattr("agentrl.sandbox.images.docker_client", no_engine)
    grader = FakeGrader()
    with pytest.raises(DockerUnavailableError, match="no Docker engine answers"):
        admission.admit(
            [_task("a"), _task("b")], max_disk_mb=512, validate=True, grader=grader,
            cache=admission.ValidationCache(tmp_path),
        )  # fmt: skip
    assert grader.calls == []


# ----------------------------------------------------------------------------- sandbox death


class DyingSandbox:
    """A sandbox double: answers every command until ``die()``, then raises as a killed
    container does (SandboxError, marked dead)."""

    def __init__(self) -> None:
        self.limits = SandboxLimits()
        self.dead = False
        self.closed = False
        self.execs = 0

    def die(self) -> None:
        self.dead = True

    async def exec(self, cmd: Any, *, timeout_s: float | None = None, **_: Any) -> ExecResult:
        if self.dead:
            raise SandboxError("exec failed in sandbox: 409 Conflict (container is not running)")
        self.execs += 1
        if isinstance(cmd, list) and "kill-me" in cmd[-1]:
            self.die()
            return ExecResult("", "", 137, False, 0.0)
        return ExecResult("0123abc\n", "", 0, False, 0.0)

    async def upload(self, local: Any, dest: str = ".") -> None:
        return None

    async def healthy(self, timeout_s: float = 5.0) -> bool:
        return not self.dead

    async def close(self) -> None:
        self.closed = True


class DyingEnv(SweEnv):
    def __init__(self) -> None:
        super().__init__(tasks=[_task("t1")])
        self.box = DyingSandbox()

    async def _acquire(self, task: SweTask) -> Any:
        self._from_pool = False
        return self.box


def _policy(commands: list[str]) -> Any:
    def reply(prompt: str) -> str:
        n = prompt.count("<tool_response>")
        cmd = commands[min(n, len(commands) - 1)]
        return (
            "<tool_call>"
            + json.dumps({"name": "bash", "arguments": {"command": cmd}})
            + ("</tool_call>")
        )

    return reply


@pytest.mark.parametrize("engine_down", [False, True])
async def test_an_episode_whose_container_dies_is_discarded_with_its_reason(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch, engine_down: bool
) -> None:
    problem = "ConnectionError: connection refused" if engine_down else None
    monkeypatch.setattr(workspace, "_engine_problem", lambda: problem)
    env = DyingEnv()
    llm = ScriptedLLM(TextPolicy(tokenizer, _policy(["ls", "kill-me", "ls"])))
    cfg = LoopConfig(max_turns=6, max_total_tokens=8192, max_tokens_per_turn=512)
    traj = await AgentLoop(llm, tokenizer, cfg).run(env, {"id": "t1"}, task_id="t1")

    assert traj.stop_reason == StopReason.ENV_ERROR and traj.num_turns == 2, traj.error
    assert traj.error is not None and "SandboxLostError" in traj.error
    if engine_down:
        assert "the Docker engine stopped answering (ConnectionError" in traj.error
    else:
        assert "the agent's container failed (a command was killed (exit 137)" in traj.error
    assert "swe_resolved" not in traj.metrics  # never graded as 0
    assert env.box.closed  # its container is given back
    kept, why = select_groups([[traj]], dynamic_filter=False)
    assert kept == [] and why["episode:env_error"] == 1  # discarded, and counted
