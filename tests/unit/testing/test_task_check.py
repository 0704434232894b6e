"""check_env_on_tasks: the env checker on each row of a task source or list."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from agentrl import Env, StepResult
from agentrl.testing import EnvCheckError, check_env_on_tasks


class Echo(Env):
    def reset(self, task, *, seed=None):
        return task["prompt"]

    def step(self, action):
        return StepResult(reward=1, terminated=True)  # an int: a warning, once per run


def test_a_source_is_read_as_tasks_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("a", "b", "c")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the checker's warnings are returned, not emitted
        found = check_env_on_tasks(Echo, str(path))
    assert len(found) == 1 and "reward is a int" in found[0]


def test_the_bad_row_and_its_missing_field_are_named() -> None:
    rows = [{"prompt": "a"}, {"prompt": "b"}, {"question": "c", "id": 3}]
    with pytest.raises(EnvCheckError) as e:
        check_env_on_tasks(Echo, rows, label="my rows")
    msg = str(e.value)
    assert msg.startswith("my rows, row 2: Echo: reset(task, seed=0) raised KeyError"), msg
    assert msg.endswith("the row has no field 'prompt' (its fields: question, id)")
    assert check_env_on_tasks(Echo, rows, limit=2)


def test_no_rows_is_an_error() -> None:
    with pytest.raises(EnvCheckError, match="no tasks to check"):
        check_env_on_tasks(Echo, [])
