"""``agentrl doctor env --task JSON / --tasks FILE``: the env checker on a user's own rows;
the first bad row is one error line naming its index (and the field it lacks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.cli.app import app

QUIZ = textwrap.dedent(
    """
    from agentrl import Env, StepResult

    class Quiz(Env):
        def reset(self, task, *, seed=None):
            self.answer = str(task["answer"])
            return f"What is {task['question']}?"

        def step(self, action):
            return StepResult(reward=float(action.text == self.answer), terminated=True)

    class Picky(Quiz):
        @staticmethod
        def load_tasks(path):
            import json
            rows = [json.loads(line) for line in open(path)]
            for i, row in enumerate(rows):
                if not str(row.get("answer", "")).isdigit():
                    raise ValueError(f"{path} (line {i + 1}): answer must be a number")
            return rows
    """
)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("doctor-env")
    (d / "quiz.py").write_text(QUIZ)
    rows = {
        "good.jsonl": [{"question": "2+2", "answer": 4}, {"question": "1+1", "answer": 2}],
        "no_question.jsonl": [{"question": "2+2", "answer": 4}, {"q": "1+1", "answer": 2}],
        "words.jsonl": [{"question": "2+2", "answer": "four"}],
    }
    for name, items in rows.items():
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in items))
    (d / "not_rows.jsonl").write_text('{"question": "2+2", "answer": 4}\n[1, 2]\n')
    return d


def doctor(work: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    monkeypatch.chdir(work)
    res = CliRunner().invoke(app, ["doctor", "env", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res.exit_code, res.output


def error_line(out: str) -> str:
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out, out
    return errors[0]


def test_every_row_of_a_task_file_is_checked(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = doctor(work, monkeypatch, "--env", "quiz.py:Quiz", "--tasks", "good.jsonl")
    assert code == 0, out
    assert "quiz.py:Quiz: ok on 2 tasks (tasks=good.jsonl)" in out


def test_limit_checks_the_first_rows(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--env", "quiz.py:Quiz", "--tasks", "no_question.jsonl", "--limit", "1"]
    code, out = doctor(work, monkeypatch, *args)
    assert code == 0 and "ok on 1 task (" in out, out


def test_a_row_without_a_field_the_env_reads_is_named(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out = doctor(work, monkeypatch, "--env", "quiz.py:Quiz", "--tasks", "no_question.jsonl")
    assert code == 2, out
    line = error_line(out)
    assert line.startswith("error: tasks=no_question.jsonl, row 1: Quiz: reset("), line
    assert "the row has no field 'question' (its fields: q, answer)" in line


def test_a_row_that_is_not_a_mapping_is_named(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = doctor(work, monkeypatch, "--env", "quiz.py:Quiz", "--tasks", "not_rows.jsonl")
    assert code == 2 and "row 1: a list, not a mapping" in error_line(out), out


def test_the_envs_load_tasks_reads_the_file(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = doctor(work, monkeypatch, "--env", "quiz.py:Picky", "--tasks", "words.jsonl")
    assert code == 2, out
    assert "tasks=words.jsonl (line 1): answer must be a number" in error_line(out)
    code, out = doctor(work, monkeypatch, "--env", "quiz.py:Picky", "--tasks", "good.jsonl")
    assert code == 0 and "ok on 2 tasks" in out, out


def test_a_missing_task_file_is_one_line(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = doctor(work, monkeypatch, "--env", "quiz.py:Quiz", "--tasks", "nope.jsonl")
    assert code == 2 and "tasks=nope.jsonl" in error_line(out), out


@pytest.mark.parametrize(
    ("task", "code", "expected"),
    [
        ('{"question": "2+2", "answer": 4}', 0, "quiz.py:Quiz: ok on 1 task (--task)"),
        ('{"answer": 4}', 2, "error: --task, row 0: Quiz: reset("),
        ('{"question": 2+2}', 2, "error: --task is not valid JSON"),
        ('["2+2", 4]', 2, "error: --task must be a JSON object"),
    ],
)
def test_one_task_as_json(
    work: Path, monkeypatch: pytest.MonkeyPatch, task: str, code: int, expected: str
) -> None:
    got, out = doctor(work, monkeypatch, "--env", "quiz.py:Quiz", "--task", task)
    assert got == code and expected in out, out
    if code:
        error_line(out)


def test_task_and_tasks_together_are_refused(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--env", "quiz.py:Quiz", "--task", "{}", "--tasks", "good.jsonl"]
    code, out = doctor(work, monkeypatch, *args)
    assert code == 2 and "not both" in error_line(out), out


def test_the_real_command(work: Path) -> None:
    args = ["doctor", "env", "--env", "quiz.py:Quiz", "--tasks", "no_question.jsonl"]
    r = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args],
        cwd=work,
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "row 1" in error_line(out) and "no field 'question'" in out
