"""Every mistake a user can make prints one clear line and exits 2, without a traceback.

The cases run the CLI's entry (``run_cli``, what ``python -m agentrl.cli`` and the console
script call) in this process, each in the work directory; the real command in a
subprocess covers both entry points, ``--debug`` and a missing Docker engine. None gets
as far as starting a server or building a model.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl.cli.errors import is_user_error, user_message

NO_TASKS_ENV = textwrap.dedent(
    """
    from agentrl import Env

    class NoTasks(Env):
        def reset(self, task):
            return [{"role": "user", "content": "hi"}]

        def step(self, action):
            return [], 1.0, True, False, {}
    """
)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli-errors")
    (d / "my_env.py").write_text(NO_TASKS_ENV)
    (d / "bad.jsonl").write_text('{"prompt": "a"}\n{not json\n')
    (d / "bad.yaml").write_text("steps: [1,\n")
    (d / "empty_model").mkdir()
    return d


def agentrl(work: Path, *args: str, entry: str = "module", **env: str):
    """Runs the CLI as ``python -m agentrl.cli`` or through the console script's ``app()``."""
    cmd = (
        [sys.executable, "-m", "agentrl.cli", *args]
        if entry == "module"
        else [sys.executable, "-c", "import sys; from agentrl.cli.app import app; sys.exit(app())",
              *args]
    )  # fmt: skip
    return subprocess.run(
        cmd, cwd=work, env={**os.environ, **env}, capture_output=True, text=True, timeout=180
    )


CASES = {
    "custom env without tasks": (["train", "--env", "my_env.py:NoTasks"], "no built-in tasks"),
    "unknown env": (["train", "--env", "no_such_env"], "unknown env 'no_such_env'"),
    "env file without the class": (["train", "--env", "my_env.py:Nope"], "no attribute 'Nope'"),
    "missing task file": (["train", "--tasks", "missing.jsonl"], "does not exist"),
    "malformed task file": (["train", "--tasks", "bad.jsonl"], "not valid JSON"),
    "model path missing": (["train", "model.path=/no/such/model"], "cannot load its tokenizer"),
    "model dir without tokenizer": (["train", "model.path=empty_model"], "empty_model"),
    "unknown config key": (["train", "trainer.nope=1"], "unknown key 'trainer.nope'"),
    "missing config file": (["train", "--config", "missing.yaml"], "does not exist"),
    "config file not YAML": (["train", "--config", "bad.yaml"], "invalid YAML"),
    "eval of an unknown env": (["eval", "--env", "no_such_env"], "unknown env"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_user_error_is_one_line_without_traceback(
    work: Path, case: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    import signal

    from agentrl.cli.app import app
    from agentrl.cli.errors import run_cli

    args, expected = CASES[case]
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))
    term = signal.getsignal(signal.SIGTERM)  # run_cli installs its own handler
    try:
        with pytest.raises(SystemExit) as end:
            run_cli(app, args)
    finally:
        signal.signal(signal.SIGTERM, term)
    out = "".join(capfd.readouterr())
    assert end.value.code == 2, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], out


def test_missing_docker_is_a_user_error(work: Path, tmp_path: Path) -> None:
    r = agentrl(work, "sandbox", "build", "python", DOCKER_HOST=f"unix://{tmp_path}/no.sock")
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out, out
    assert "error: no Docker engine answers" in out and "setup-docker.sh" in out


@pytest.mark.parametrize("entry", ["module", "app"])
def test_the_real_command_handles_user_errors(work: Path, entry: str) -> None:
    r = agentrl(work, "train", "--env", "my_env.py:NoTasks", entry=entry)
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no built-in tasks" in errors[0], out


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(work: Path, where: str) -> None:
    args = ["train", "--env", "my_env.py:NoTasks"]
    r = agentrl(work, *(["--debug", *args] if where == "before" else [*args, "--debug"]))
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" in out and "TaskSpecError" in out, out
    assert out.rstrip().splitlines()[-1].startswith("error: env 'my_env.py:NoTasks'")


def test_a_bug_is_not_a_user_error() -> None:
    from agentrl.config import ConfigError
    from agentrl.errors import TaskSpecError

    assert is_user_error(TaskSpecError("x")) and is_user_error(ConfigError("y"))
    assert not is_user_error(RuntimeError("bug")) and not is_user_error(KeyError("k"))
    import yaml

    try:
        yaml.safe_load("a: [1,\n")
    except yaml.YAMLError as e:
        msg = user_message(e)
    assert msg.startswith("invalid YAML: ") and "\n" not in msg
