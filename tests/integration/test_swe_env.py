"""SWE env against real Docker: task validation, scripted episodes through the AgentLoop,
and the security properties (fresh grading container, no hidden tests or history)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from agentrl.envs.swe import Grader, GraderError, SweEnv, builtin_tasks
from agentrl.envs.swe.validate import check_all, validate_task
from agentrl.rollout import AgentLoop, LoopConfig
from agentrl.sandbox.docker_pool import DockerSandboxPool
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy
from agentrl.types import StopReason, Trajectory
from tests.integration import docker_fixtures
from tests.integration.docker_fixtures import LIMITS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
docker_image = docker_fixtures.docker_image  # the session fixture, under its own name

TASK_ID = "swe-001-pager-off-by-one"
HIDDEN = "tests/test_pager_hidden.py"
FIX = {
    "command": "str_replace",
    "path": "pager.py",
    "old_str": "start = page * per_page",
    "new_str": "start = (page - 1) * per_page",
}
CONFIG = LoopConfig(max_turns=12, max_total_tokens=32768, max_tokens_per_turn=2048)


def _task() -> Any:
    return next(t for t in builtin_tasks() if t.id == TASK_ID)


def _call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def scripted(calls: Sequence[tuple[str, dict[str, Any]]]) -> Callable[[str], str]:
    """A policy that makes ``calls`` in order, one per turn (turn n = n tool responses seen)."""

    def reply(prompt: str) -> str:
        n = prompt.count("<tool_response>")
        if n >= len(calls):
            return "I am done."
        name, args = calls[n]
        return _call(name, **args)

    return reply


async def run_episode(
    tokenizer: Any, image: str, calls: Sequence[tuple[str, dict[str, Any]]], **env_kw: Any
) -> tuple[Trajectory, SweEnv]:
    env = SweEnv(image=image, limits=LIMITS, grader=Grader(image=image, limits=LIMITS), **env_kw)
    llm = ScriptedLLM(TextPolicy(tokenizer, scripted(calls)))
    traj = await AgentLoop(llm, tokenizer, CONFIG).run(env, {"id": TASK_ID}, task_id=TASK_ID)
    assert traj.error is None, traj.error
    return traj, env


def tool_outputs(traj: Trajectory) -> list[str]:
    return [m.content for m in traj.messages if m.role == "tool"]


# ----------------------------------------------------------------------------- validation


async def test_whole_builtin_set_validates(docker_image: str) -> None:
    tasks = builtin_tasks()
    assert len(tasks) >= 20
    results = await check_all(tasks, grader=Grader(image=docker_image, limits=LIMITS))
    for r in results:
        assert r.gold is not None and r.gold.reward == 1.0 and r.gold.tests_passed >= 1
        assert r.empty is not None and r.empty.reward == 0.0 and r.empty.tests_failed >= 1


async def test_validation_names_a_task_whose_gold_patch_fails(docker_image: str) -> None:
    task = _task()
    wrong = task.gold_patch.replace("(page - 1) * per_page", "page * per_page + 0")
    bad = dataclasses.replace(task, id="broken-gold", gold_patch=wrong)
    result = await validate_task(bad, Grader(image=docker_image, limits=LIMITS))
    assert not result.ok
    assert "broken-gold: the gold patch does not pass the hidden tests" in result.message()


async def test_a_broken_test_command_raises_instead_of_scoring_zero(docker_image: str) -> None:
    task = dataclasses.replace(
        _task(), id="broken-cmd", test_command="python3 -m pytest -q nope.py"
    )
    with pytest.raises(GraderError, match=r"broken-cmd.*usage error"):
        await Grader(image=docker_image, limits=LIMITS).grade(task, task.gold_patch)


# ----------------------------------------------------------------------------- episodes


async def test_scripted_fix_then_submit_earns_reward_1(tokenizer: Any, docker_image: str) -> None:
    calls = [
        ("str_replace_editor", {"command": "view", "path": "/workspace/repo/pager.py"}),
        ("str_replace_editor", {"command": "view", "path": "/etc/passwd"}),
        ("str_replace_editor", FIX),
        ("bash", {"command": "python3 -m pytest -q -p no:cacheprovider tests/test_pager.py"}),
        ("submit", {}),
    ]
    async with DockerSandboxPool(1, docker_image, LIMITS, health_interval_s=0) as pool:
        traj, env = await run_episode(tokenizer, docker_image, calls, sandbox_pool=pool)
    assert traj.stop_reason == StopReason.DONE and traj.reward == 1.0
    out = tool_outputs(traj)
    assert "start = page * per_page" in out[0] and "\t" in out[0]  # numbered lines
    assert "outside the repository /workspace/repo" in out[1]
    assert "start = (page - 1) * per_page" in out[2]
    assert "1 passed" in out[3]
    assert traj.info["swe_ended_by"] == "submit" and traj.info["swe_tests_failed"] == 0
    assert traj.metrics["swe_resolved"] == 1.0
    assert "pager.py" in env.last_patch and HIDDEN not in env.last_patch


async def test_submit_without_fixing_earns_0(tokenizer: Any, docker_image: str) -> None:
    traj, env = await run_episode(tokenizer, docker_image, [("submit", {})])
    assert traj.stop_reason == StopReason.DONE and traj.reward == 0.0
    assert env.last_grade is not None and env.last_grade.tests_failed >= 1
    assert env.last_patch == ""


async def test_writing_the_hidden_tests_location_earns_nothing(
    tokenizer: Any, docker_image: str
) -> None:
    fake = "def test_ok():\n    assert True\n"
    always_pass = (
        "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    out = yield\n    out.get_result().outcome = 'passed'\n"
    )
    calls = [
        ("str_replace_editor", {"command": "create", "path": HIDDEN, "file_text": fake}),
        (
            "str_replace_editor",
            {"command": "create", "path": "conftest.py", "file_text": always_pass},
        ),
        ("bash", {"command": "printf '[pytest]\\naddopts = -q\\n' > pytest.ini"}),
        ("submit", {}),
    ]
    traj, env = await run_episode(tokenizer, docker_image, calls)
    assert traj.reward == 0.0
    assert env.last_grade is not None and env.last_grade.tests_failed >= 1
    assert {HIDDEN, "conftest.py", "pytest.ini"} <= set(traj.info["swe_dropped_paths"])


async def test_exiting_early_from_the_code_under_test_earns_nothing(
    tokenizer: Any, docker_image: str
) -> None:
    calls = [
        ("bash", {"command": "printf 'import os\\nos._exit(0)\\n' >> pager.py"}),
        ("submit", {}),
    ]
    traj, env = await run_episode(tokenizer, docker_image, calls)
    assert traj.reward == 0.0 and env.last_grade is not None
    assert env.last_grade.exit_code == 0 and "no passing summary" in env.last_grade.detail


async def test_agent_container_holds_no_hidden_tests_grader_or_history(
    tokenizer: Any, docker_image: str
) -> None:
    probe = (
        "grep -rl --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "
        "test_last_page_is_partial / 2>/dev/null; echo grep-done; "
        "python3 -c 'import agentrl' 2>&1 | tail -1; ls -a /workspace /workspace/repo"
    )
    git = (
        "git log --all --oneline | wc -l; echo remotes:$(git remote); echo tags:$(git tag); "
        "echo reflog:$(git reflog 2>/dev/null | wc -l); git status --porcelain | wc -l"
    )
    calls = [("bash", {"command": probe}), ("bash", {"command": git}), ("submit", {})]
    traj, _ = await run_episode(tokenizer, docker_image, calls)
    found, history = tool_outputs(traj)[:2]
    assert found.startswith("grep-done"), found  # the hidden test's text is nowhere
    assert "No module named 'agentrl'" in found
    assert "test_pager_hidden.py" not in found and "pager.py" in found
    assert history.split() == ["1", "remotes:", "tags:", "reflog:0", "0"], history
