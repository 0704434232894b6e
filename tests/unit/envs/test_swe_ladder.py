"""The generated SWE levels (agentrl/envs/swe/ladder.py) and the worked episode."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentrl.envs.swe import SweEnv
from agentrl.envs.swe.editor import Editor, MemoryFS
from agentrl.envs.swe.ladder import HELD_OUT, check_locally, generate_tasks, ladder_size
from agentrl.envs.swe.loader import parse_task
from agentrl.envs.swe.patch import split_patch
from agentrl.envs.swe.worked import worked_example_messages, worked_files
from agentrl.envs.swe.workspace import REPO_DIR


@pytest.mark.parametrize("level", ["tiny", "small"])
def test_every_generated_task_is_valid(level: str) -> None:
    train, test = generate_tasks("train", level=level), generate_tasks("test", level=level)
    assert len(train) >= 200 and len(test) == HELD_OUT >= 50
    assert len(train) + len(test) == ladder_size()
    bad = {t.id: p for t in train + test if (p := check_locally(t))}
    assert bad == {}
    for t in train + test:  # one file, one line changed, and it round-trips as a row
        assert len(split_patch(t.gold_patch)) == 1, t.id
        changed = [ln for ln in t.gold_patch.splitlines() if ln[:1] in "+-"]
        assert len(changed) == 4, t.id  # ---, +++, one - and one +
        assert parse_task(t.to_row()) == t


def test_held_out_tasks_share_no_bug_function_and_module_with_training() -> None:
    def key(t):
        return (t.metadata["bug"], t.metadata["function"], t.metadata["file"])

    train, test = generate_tasks("train"), generate_tasks("test")
    assert not {key(t) for t in train} & {key(t) for t in test}
    assert len({t.id for t in train + test}) == len(train) + len(test)
    assert len({t.metadata["bug"] for t in test}) >= 10  # every kind of skill is tested


def test_the_split_is_a_function_of_the_seed() -> None:
    assert generate_tasks("test", seed=3) == generate_tasks("test", seed=3)
    assert [t.id for t in generate_tasks("test", seed=3)] != [
        t.id for t in generate_tasks("test", seed=4)
    ]


def test_tiny_names_the_fix_and_small_does_not() -> None:
    tiny, small = generate_tasks("test", level="tiny")[0], generate_tasks("test", level="small")[0]
    meta = tiny.metadata
    assert meta["file"] in tiny.issue and meta["function"] in tiny.issue
    assert "replace" in tiny.issue and "replace" not in small.issue
    assert tiny.repo_files == small.repo_files and tiny.hidden_tests == small.hidden_tests


def test_bad_levels_and_splits_are_refused() -> None:
    with pytest.raises(ValueError, match="built-in set"):
        generate_tasks("train", level="standard")
    with pytest.raises(ValueError, match="split"):
        generate_tasks("validation")
    with pytest.raises(ValueError):
        generate_tasks("train", level="huge")


def test_default_tasks_serves_the_levels() -> None:
    rows = SweEnv.default_tasks("test", level="tiny", n=5)
    assert [r["id"] for r in rows] == [t.id for t in generate_tasks("test", n=5)]
    assert len(SweEnv.default_tasks("train")) == 20  # standard: the built-in set


def test_worked_episodes_show_what_the_tools_print() -> None:
    """Each example's editor output equals the real Editor's on its repository, and its
    issue is written as a tiny task's."""
    msgs = worked_example_messages(3, SweEnv._issue_text)
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "assistant", "tool"] * 3
    for i in range(3):
        user, edit, edited, submit, _ = msgs[5 * i : 5 * i + 5]
        call = json.loads(edit.content.split("\n")[1])
        assert call["name"] == "str_replace_editor"
        assert json.loads(submit.content.split("\n")[1]) == {"name": "submit", "arguments": {}}
        assert f"replace `{call['arguments']['old_str']}` with" in user.content
        fs = MemoryFS({f"{REPO_DIR}/{p}": text for p, text in worked_files(i).items()})
        assert asyncio.run(Editor(fs, REPO_DIR).run(**call["arguments"])) == edited.content
    assert worked_example_messages(0, SweEnv._issue_text) == []
    with pytest.raises(ValueError, match="worked_examples"):
        worked_example_messages(4, SweEnv._issue_text)


def test_reset_shows_the_examples_between_system_and_issue() -> None:
    env = SweEnv(worked_examples=2)
    assert env._examples == worked_example_messages(2, SweEnv._issue_text)


def test_run_pools_only_when_asked() -> None:
    assert SweEnv.run_resources() is None  # no pool sizes: one container per episode
    assert SweEnv.run_resources(sandbox_pool_size=0, grader_pool_size=0) is None
    assert SweEnv.run_resources(sandbox_pool_size=2) is not None
    with pytest.raises(ValueError, match="pool_size"):
        SweEnv(sandbox_pool_size=-1)


def test_graded_step_reports_the_pools_busy_share() -> None:
    from agentrl.envs.swe.grader import GradeResult
    from agentrl.envs.swe.outcome import graded_step

    class Pool:
        size = 4

        def metrics(self) -> dict[str, float]:
            return {"leased": 3.0}

    patch = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
    res = graded_step(GradeResult(1.0, True, True), patch, "t", "submit", Pool())  # type: ignore[arg-type]
    assert res.metrics["swe_pool_busy"] == 0.75 and res.metrics["swe_patch_lines"] == 2.0
    assert res.reward == 1.0 and res.terminated and res.info["swe_ended_by"] == "submit"
    assert "swe_pool_busy" not in graded_step(GradeResult(0.0, False, True), "", "t", "x").metrics
