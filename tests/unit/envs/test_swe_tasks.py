"""SWE tasks: the built-in set, the loader formats, the SWE-bench adapter, patch filtering
and clear errors for malformed tasks (no Docker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.envs.swe import (
    SweEnv,
    SweTask,
    TaskFormatError,
    builtin_tasks,
    filter_patch,
    from_swebench,
    load_tasks,
    parse_task,
    split_patch,
)
from agentrl.envs.swe.grader import pytest_counts

GOLD = """diff --git a/m.py b/m.py
--- a/m.py
+++ b/m.py
@@ -1 +1 @@
-x = 1
+x = 2
"""
ROW = {
    "id": "t1",
    "issue": "x should be 2",
    "repo_files": {"m.py": "x = 1\n"},
    "gold_patch": GOLD,
    "hidden_tests": {"tests/test_m.py": "from m import x\n\ndef test_x():\n    assert x == 2\n"},
}


def test_builtin_set_is_well_formed_and_varied() -> None:
    tasks = builtin_tasks()
    assert len(tasks) >= 20
    assert len({t.id for t in tasks}) == len(tasks)
    for t in tasks:
        assert t.hidden_tests and t.repo_files
        assert not set(t.hidden_tests) & set(t.repo_files)  # hidden tests are not in the snapshot
        assert t.command().startswith("python3 -m pytest")
        assert all(p in t.repo_files for p in t.visible_tests)


def test_row_round_trips_and_test_command_defaults_to_pytest() -> None:
    task = parse_task(ROW)
    assert task.command() == "python3 -m pytest -q -p no:cacheprovider 'tests/test_m.py'"
    assert parse_task(task.to_row()) == task


def test_task_directory_and_jsonl_formats(tmp_path: Path) -> None:
    d = tmp_path / "tasks" / "dir-task"
    (d / "repo").mkdir(parents=True)
    (d / "repo" / "m.py").write_text("x = 1\n")
    (d / "hidden_tests" / "tests").mkdir(parents=True)
    (d / "hidden_tests" / "tests" / "test_m.py").write_text(ROW["hidden_tests"]["tests/test_m.py"])
    (d / "gold.patch").write_text(GOLD)
    (d / "issue.md").write_text("x should be 2\n")
    (d / "task.json").write_text(json.dumps({"visible_tests": []}))
    (tmp_path / "tasks" / "more.jsonl").write_text(json.dumps({**ROW, "id": "t2"}) + "\n")
    tasks = load_tasks(tmp_path / "tasks")
    assert [t.id for t in tasks] == ["dir-task", "t2"]
    assert tasks[0].snapshot_files() == {"m.py": b"x = 1\n"}
    assert tasks[0].hidden_tests == ROW["hidden_tests"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"issue": ""}, "missing field 'issue'"),
        ({"gold_patch": "not a diff"}, "'gold_patch' is not a git diff"),
        ({"hidden_tests": {}}, "no hidden tests"),
        ({"hidden_tests": {"../escape.py": "x"}}, "must be relative and inside the repo"),
        (
            {"repo_files": {"other.py": ""}},
            "gold_patch changes 'm.py', which is not in the snapshot",
        ),
        ({"repo_dir": "somewhere"}, "exactly one snapshot source"),
        ({"surprise": 1}, "unknown field"),
        (
            {"repo_files": {"conftest.py": ""}, "gold_patch": GOLD.replace("m.py", "conftest.py")},
            "protected path",
        ),
    ],
)
def test_malformed_rows_raise_errors_naming_the_task(change: dict, message: str) -> None:
    with pytest.raises(TaskFormatError, match=message) as e:
        parse_task({**ROW, **change}, source="file.jsonl (line 3)")
    assert "'t1'" in str(e.value) and "file.jsonl (line 3)" in str(e.value)


def test_duplicate_ids_and_bad_json_lines(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps(ROW) + "\n" + json.dumps(ROW) + "\n")
    with pytest.raises(TaskFormatError, match="two tasks have the id 't1'"):
        load_tasks(f)
    f.write_text("{oops\n")
    with pytest.raises(TaskFormatError, match="line 1"):
        load_tasks(f)


async def test_env_reset_rejects_bad_tasks_before_starting_a_container() -> None:
    env = SweEnv()
    with pytest.raises(TaskFormatError, match=r"'t1'.*missing field 'gold_patch'"):
        await env.reset({k: v for k, v in ROW.items() if k != "gold_patch"})
    with pytest.raises(TaskFormatError, match="unknown SWE task id 'nope'"):
        await env.reset({"id": "nope"})
    assert env.sandbox is None


def test_swebench_adapter() -> None:
    test_patch = GOLD.replace("m.py", "tests/test_m.py")
    record = {
        "instance_id": "org__proj-123",
        "repo": "org/proj",
        "base_commit": "abc",
        "patch": GOLD,
        "test_patch": test_patch,
        "problem_statement": "x is wrong",
        "FAIL_TO_PASS": '["tests/test_m.py::test_x"]',
        "PASS_TO_PASS": [],
        "image_name": "sweb.eval.x86_64.org__proj-123:latest",
    }
    task = from_swebench(record)
    assert task.image == record["image_name"] and task.image_repo_path == "/testbed"
    assert task.command().endswith("'tests/test_m.py::test_x'")
    assert task.metadata["FAIL_TO_PASS"] == ["tests/test_m.py::test_x"]
    assert task.is_protected("tests/test_m.py") and not task.is_protected("m.py")
    with pytest.raises(TaskFormatError, match=r"'org__proj-123'.*image_name"):
        from_swebench({**record, "image_name": ""})
    # a task file may hold SWE-bench records as they are, with their own repo_path/env_setup
    setup = "source /opt/miniconda3/bin/activate testbed"
    loaded = parse_task({**record, "repo_path": "/src", "env_setup": setup})
    assert loaded.id == "org__proj-123" and loaded.image_repo_path == "/src"
    assert loaded.command().startswith(setup)
    with pytest.raises(TaskFormatError, match=r"line 3.*'org__proj-123'.*patch"):
        parse_task({**record, "patch": ""}, source="f.jsonl (line 3)")


def test_filter_patch_drops_protected_paths_and_symlinks() -> None:
    task = parse_task(ROW)
    link = (
        "diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+/etc\n"
    )
    patch = GOLD + GOLD.replace("m.py", "tests/test_m.py") + GOLD.replace("m.py", "a/conftest.py")
    patch += GOLD.replace("m.py", "tests") + link
    kept, dropped = filter_patch(patch, task.is_protected)
    assert [fp.new_path for fp in split_patch(kept)] == ["m.py"]
    assert dropped == ["tests/test_m.py", "a/conftest.py", "tests", "l"]


def test_split_patch_reads_quoted_new_and_deleted_paths() -> None:
    patch = (
        'diff --git "a/sp ace\\tx.py" "b/sp ace\\tx.py"\nnew file mode 100644\n'
        '--- /dev/null\n+++ "b/sp ace\\tx.py"\n@@ -0,0 +1 @@\n+a\n'
        "diff --git a/gone.py b/gone.py\ndeleted file mode 100644\n--- a/gone.py\n+++ /dev/null\n"
    )
    a, b = split_patch(patch)
    assert (a.old_path, a.new_path) == (None, "sp ace\tx.py")
    assert (b.old_path, b.new_path) == ("gone.py", None)


def test_pytest_summary_counts() -> None:
    assert pytest_counts("..F\n1 failed, 2 passed in 0.05s\n") == {"failed": 1, "passed": 2}
    assert pytest_counts("== 3 passed, 1 error in 1.2s ==") == {"passed": 3, "errors": 1}
    assert pytest_counts("killed") is None


def test_task_is_frozen() -> None:
    task: SweTask = parse_task(ROW)
    with pytest.raises(AttributeError):
        setattr(task, "id", "other")  # noqa: B010  # a plain assignment must fail: frozen


def test_default_splits_are_disjoint_and_cover_the_set() -> None:
    train = {r["id"] for r in SweEnv.default_tasks("train")}
    test = {r["id"] for r in SweEnv.default_tasks("test")}
    assert train and test and not train & test
    assert train | test == {t.id for t in builtin_tasks()}
