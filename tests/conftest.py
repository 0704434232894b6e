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


PIN_ENV = "AGENTRL_TEST_PIN_WORKERS"


def _pin_xdist_worker() -> None:
    """With ``AGENTRL_TEST_PIN_WORKERS=1``, each pytest-xdist worker takes its own share
    of the CPUs: the worker, every process it starts (runs, trainers, Ray), its vLLM
    servers' OpenMP threads and torch's intra-op pool. Unpinned, every server's vLLM
    ('auto' binding) computes on the first CPU and the workers' torch pools oversubscribe
    the rest."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if os.environ.get(PIN_ENV) != "1" or not worker.startswith("gw"):
        return
    from agentrl.runtime.cpus import cpu_list

    cpus = sorted(os.sched_getaffinity(0))
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = max(1, len(cpus) // count)
    index = int(worker[2:]) % max(1, len(cpus) // share)
    mine = cpus[index * share : (index + 1) * share]
    os.sched_setaffinity(0, mine)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list(mine)
    os.environ["OMP_NUM_THREADS"] = str(len(mine))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(len(mine))


# ---- make test's parallel integration phase: whole modules per worker -----------------
# Modules whose tests must share one worker with other modules' (one two-server `fleet`
# per session; one Ray cluster at a time).
_SHARED_SCOPES = {
    "tests/integration/test_examples.py": "fleet",
    "tests/integration/test_inference_fleet.py": "fleet",
    "tests/integration/test_ray_multinode.py": "ray",
    "tests/integration/test_ray_placement.py": "ray",
}


def integration_scope(nodeid: str) -> str:
    """The unit of work of one xdist worker: a test module, or its shared group.

    (pytest-xdist 3.8's ``loadgroup`` suffixes ``item._nodeid``, which pytest 9 no longer
    reads, so its groups silently fell apart test by test; this scheduler groups by the
    node id the controller sees.)
    """
    path = nodeid.split("::", 1)[0]
    return _SHARED_SCOPES.get(path, path)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` with :func:`integration_scope` as the scope (make test's
    parallel integration phase)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return integration_scope(nodeid)

    return ModuleScheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    global _leak_check
    from tests.leak_check import MARK_ENV, LeakCheck

    _pin_xdist_worker()
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
