"""A quiet, honest console (issue #40): wandb prints nothing of its own, one line points to
its files; dependency warnings nobody running agentrl can act on are not shown, ours are."""

from __future__ import annotations

import asyncio
import io
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from agentrl.config import load_config
from agentrl.orchestration.run import ComponentError, train
from agentrl.reporting.progress import ProgressLog, wandb_pointer
from agentrl.reporting.quiet import DEPENDENCY_WARNINGS, quiet_dependency_warnings

WANDB_NOISE = ("Run summary", "Run history", "You can sync", "Find logs", "Tracking run",
               "Run data is saved", "wandb leet", "W&B syncing", "Detected [", "Weave")  # fmt: skip


def test_an_offline_run_prints_one_line_to_its_files_and_nothing_of_wandbs(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import openai  # noqa: F401  (an LLM client in the process: wandb would advertise Weave)

    # A narrow console on the real stdout: the line is a path, never wrapped.
    console = Console(file=sys.stdout, width=40, force_terminal=False)
    log = ProgressLog(2, tmp_path, wandb_mode="offline", config={"steps": 2}, console=console)
    log.step(1, {"reward/mean": 0.25})
    log.step(2, {"reward/mean": 0.5})
    log.eval(2, {"success": 1.0})
    log.close()
    log.close()  # idempotent: still one line
    out, err = capfd.readouterr()
    text = out + err
    assert not [n for n in WANDB_NOISE if n in text], text
    pointers = [line for line in text.splitlines() if "wandb" in line]
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    assert pointers == [f"wandb: offline run files in {run}; upload with: wandb sync {run}"]
    steps = [line.split(" | eta")[0] for line in out.splitlines()[:2]]
    assert steps == ["step 1/2 | reward 0.250", "step 2/2 | reward 0.500"]
    assert out.splitlines()[2] == pointers[0]  # last, after the step lines
    # wandb still writes its files: the run's records and its logs. (Its console capture,
    # files/output.log, depends on how the process's stdout is captured: in the full suite
    # it was absent, so it is not a claim of ours.)
    (records,) = run.glob("run-*.wandb")
    assert records.stat().st_size > 0
    assert (run / "logs" / "debug-internal.log").is_file()


def test_a_disabled_run_says_nothing_about_wandb(tmp_path: Path) -> None:
    out = io.StringIO()
    log = ProgressLog(1, tmp_path, wandb_mode="disabled", console=Console(file=out, width=200))
    log.step(1, {"reward/mean": 0.5})
    log.close()
    assert "wandb" not in out.getvalue() and not (tmp_path / "wandb").exists()


def test_the_pointer_of_an_online_run_is_its_url() -> None:
    url = "https://wandb.ai/me/agentrl/runs/abc123"
    assert wandb_pointer(SimpleNamespace(offline=False, url=url)) == f"wandb: run at {url}"
    assert wandb_pointer(SimpleNamespace(offline=False, url=None)) is None


def _script_method_deprecation() -> None:
    """What importing vLLM's parsers does 14 times: torch's note on TorchScript methods."""

    def forward(self, x):
        return x

    torch.jit.script_method(forward)


def test_listed_dependency_warnings_are_not_shown_and_ours_are() -> None:
    with warnings.catch_warnings(record=True) as shown:
        warnings.resetwarnings()
        warnings.simplefilter("always")  # as -W always: everything else is shown
        quiet_dependency_warnings()
        quiet_dependency_warnings()  # idempotent
        _script_method_deprecation()
        # Ours: a warning the person running agentrl can act on.
        mem = "trainer memory: the model needs 9 GB, 4 GB available"
        warnings.warn_explicit(
            mem, RuntimeWarning, "memory.py", 1, module="agentrl.trainer.engine.memory"
        )
        # The same module with another message, and the message from another module: shown.
        other = "some other note"
        warnings.warn_explicit(
            other, DeprecationWarning, "_script.py", 1, module="torch.jit._script"
        )
        jit = "`torch.jit.script_method` is deprecated."
        warnings.warn_explicit(jit, DeprecationWarning, "x.py", 1, module="agentrl.x")
        ours = [f for f in warnings.filters if f[0] == "ignore" and f[3] is not None]
        assert len(ours) == len(DEPENDENCY_WARNINGS)
    assert [str(w.message) for w in shown] == [mem, other, jit]


def test_without_the_filters_the_dependency_warning_is_shown() -> None:
    # The check above is not vacuous: the same call, unfiltered, warns.
    with warnings.catch_warnings(record=True) as shown:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        _script_method_deprecation()
    assert [w.category for w in shown] == [DeprecationWarning]
    assert str(shown[0].message).startswith("`torch.jit.script_method` is deprecated")


def _ours_installed() -> bool:
    return any(
        f[0] == "ignore" and f[3] is not None and f[3].pattern == DEPENDENCY_WARNINGS[0].module
        for f in warnings.filters
    )


def test_the_filters_are_installed_by_a_run_not_by_importing_agentrl() -> None:
    with warnings.catch_warnings():
        assert not _ours_installed()  # agentrl.orchestration.run is imported above
        cfg = load_config(None, ["reward.url=http://localhost:1"])  # refused at the start
        with pytest.raises(ComponentError, match=r"reward\.url needs reward\.model"):
            asyncio.run(train(cfg, say=lambda _m: None))
        assert _ours_installed()
