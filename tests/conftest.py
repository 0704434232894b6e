"""Shared fixtures: the tiny model's tokenizer (built once per session)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from agentrl.models.tokenizer import build_tokenizer

    return build_tokenizer(seed=0)


# ---- nothing of ours is left when the session ends (issue #14) ------------------------
_leak_check: Any = None


def pytest_configure(config: pytest.Config) -> None:
    global _leak_check
    from tests.leak_check import MARK_ENV, LeakCheck

    if _leak_check is None and MARK_ENV not in os.environ:  # the outermost session checks
        _leak_check = LeakCheck()


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Any:
    yield  # session fixtures (shared servers, pools) are torn down by now
    global _leak_check
    check, _leak_check = _leak_check, None
    if check is None or os.environ.get("AGENTRL_NO_LEAK_CHECK"):
        return
    wandb = sys.modules.get("wandb")
    if wandb is not None:  # its service process lives until this one ends: end it now
        with contextlib.suppress(Exception):
            wandb.teardown()
    leaks = check.find()
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    write = tr.write_line if tr is not None else print
    if leaks.unattributed:  # a concurrent session's, or ours unrecorded: strict mode fails
        write(f"note: new /dev/shm entries of unknown owner: {', '.join(leaks.unattributed)}")
        if os.environ.get("AGENTRL_LEAK_STRICT") == "1":
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if leaks:
        write("LEAK CHECK FAILED: the test session left these behind:\n" + leaks.report())
        check.clean(leaks)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    check.close()
