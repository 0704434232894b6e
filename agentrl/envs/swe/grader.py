"""The SWE grader: an agent's patch, applied in a fresh container, judged by hidden tests.

Grading never trusts the agent's container. The grader (this host-side code) takes the
patch text, drops every change to a protected path (hidden tests, test configuration,
symbolic links), starts a **fresh** container from the task's image, installs the
snapshot, applies the patch, only then writes the hidden tests (and the test patch) and
runs the test command. Reward 1 if it passes, else 0 (or, with ``partial_credit``, the
share of tests that passed).

A task that cannot be graded — the test command is missing, no test was collected, the
test patch does not apply — raises :class:`GraderError` instead of scoring 0, so a broken
task never passes for a hard one.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from agentrl.sandbox.base import ExecResult, SandboxLimits
from agentrl.sandbox.docker import WORKDIR, DockerSandbox
from agentrl.sandbox.docker_pool import DockerSandboxPool

from .patch import PatchError, filter_patch
from .task import SweTask
from .workspace import REPO_DIR, WorkspaceError, install_snapshot, put_files

__all__ = ["GRADER_LIMITS", "GradeResult", "Grader", "GraderError", "pytest_counts"]

GRADER_LIMITS = SandboxLimits(
    wall_timeout_s=60,
    cpu_time_s=600,
    memory_mb=1024,
    max_processes=128,
    max_file_size_mb=64,
    max_disk_mb=512,
    max_output_bytes=256 << 10,
)
_PYTEST_BROKEN = {3: "pytest crashed internally", 4: "pytest usage error", 5: "no tests collected"}
_SUMMARY = re.compile(r"^=*\s*(\d+ \w+.*|no tests ran.*) in [\d.]+s", re.M)


class GraderError(RuntimeError):
    """The task (or its image) cannot be graded; not the agent's fault."""


@dataclass(frozen=True)
class GradeResult:
    """The outcome of grading one patch.

    Attributes:
        reward: 1.0 if the hidden tests pass; else 0.0 (or the passed share, with
            partial credit).
        passed: The hidden tests passed.
        applied: The patch applied (an empty patch counts as applied).
        exit_code: The test command's exit code (None if it did not run).
        tests_passed: Passed tests in pytest's summary (0 if none was found).
        tests_failed: Failed tests plus errors in pytest's summary.
        dropped_paths: Paths whose changes were dropped (protected, or symbolic links).
        detail: Why it failed, in a line.
        output: The tail of the test (or ``git apply``) output.
        duration_s: Wall time of the grading.
    """

    reward: float
    passed: bool
    applied: bool
    exit_code: int | None = None
    tests_passed: int = 0
    tests_failed: int = 0
    dropped_paths: tuple[str, ...] = ()
    detail: str = ""
    output: str = ""
    duration_s: float = 0.0


def pytest_counts(output: str) -> dict[str, int] | None:
    """Counts of pytest's last summary line (``3 passed, 1 failed in 0.1s``), or None."""
    found = _SUMMARY.findall(output)
    if not found:
        return None
    counts: dict[str, int] = {}
    for n, word in re.findall(r"(\d+) (\w+)", found[-1]):
        key = {"error": "errors", "warning": "warnings"}.get(word, word)
        counts[key] = counts.get(key, 0) + int(n)
    return counts


class Grader:
    """Grades patches of SWE tasks in fresh containers.

    Args:
        image: Image for tasks that name none (None: agentrl/python).
        limits: Limits of the grading container (its CPU time must cover the tests).
        pool: Lend fresh containers from this pool (``reuse="replace"``) for tasks without
            their own image, instead of starting one per grading.
        partial_credit: Reward the share of passed tests when not all pass (pytest only).
    """

    def __init__(
        self,
        *,
        image: str | None = None,
        limits: SandboxLimits = GRADER_LIMITS,
        pool: DockerSandboxPool | None = None,
        partial_credit: bool = False,
    ) -> None:
        if pool is not None and pool.reuse != "replace":
            raise ValueError("the grader's pool must use reuse='replace' (a fresh container)")
        self.image = image
        self.limits = limits
        self.pool = pool
        self.partial_credit = partial_credit

    @contextlib.asynccontextmanager
    async def _container(self, task: SweTask) -> AsyncIterator[DockerSandbox]:
        if self.pool is not None and task.image is None:
            async with self.pool.sandbox() as sb:
                yield sb
            return
        async with DockerSandbox(task.image or self.image, self.limits) as sb:
            yield sb

    async def grade(self, task: SweTask, patch: str) -> GradeResult:
        """Applies ``patch`` to a fresh copy of the snapshot and runs the hidden tests.

        Raises:
            GraderError: The task cannot be graded (see the module docstring).
            SandboxError: No container could be started.
        """
        t0 = time.perf_counter()
        try:
            kept, dropped = filter_patch(patch, task.is_protected)
        except PatchError as e:
            return GradeResult(0.0, False, False, detail=f"the patch is malformed: {e}")
        async with self._container(task) as sb:
            result = await self._grade_in(sb, task, kept, tuple(dropped))
        return replace(result, duration_s=time.perf_counter() - t0)

    async def _grade_in(
        self, sb: DockerSandbox, task: SweTask, patch: str, dropped: tuple[str, ...]
    ) -> GradeResult:
        try:
            await install_snapshot(sb, task)
        except WorkspaceError as e:
            raise GraderError(f"task {task.id!r}: {e}") from e
        if patch.strip():
            res = await self._apply(sb, patch, "agent.patch")
            if not res.ok:
                out = (res.stdout + res.stderr)[-2000:]
                return GradeResult(
                    0.0, False, False, res.exit_code, dropped_paths=dropped,
                    detail="the patch does not apply to the snapshot", output=out,
                )  # fmt: skip
        await self._install_tests(sb, task)
        cmd = f"cd {REPO_DIR} && {task.command()}"
        res = await sb.exec(["bash", "-c", cmd], timeout_s=task.test_timeout_s)
        output = (res.stdout + res.stderr)[-4000:]
        if res.exit_code in (126, 127) and not res.timed_out:
            raise GraderError(
                f"task {task.id!r}: the test command could not run (exit {res.exit_code}): "
                f"{task.command()!r}\n{output[-1000:]}"
            )
        pytest = "pytest" in task.command()
        if pytest and res.exit_code in _PYTEST_BROKEN:
            raise GraderError(
                f"task {task.id!r}: {_PYTEST_BROKEN[res.exit_code]} (exit {res.exit_code}) "
                f"running {task.command()!r}; check the hidden test paths\n{output[-1500:]}"
            )
        counts = pytest_counts(output) if pytest else None
        n_pass = (counts or {}).get("passed", 0)
        n_fail = (counts or {}).get("failed", 0) + (counts or {}).get("errors", 0)
        passed = res.ok
        detail = "" if passed else f"the tests failed (exit {res.exit_code})"
        if res.timed_out:
            detail = f"the tests timed out after {task.test_timeout_s:g}s"
        if passed and pytest and (counts is None or n_pass < 1 or n_fail):
            passed, detail = False, "exit 0 but pytest reported no passing summary"
        reward = 1.0 if passed else 0.0
        if not passed and self.partial_credit and n_pass + n_fail:
            reward = n_pass / (n_pass + n_fail)
        return GradeResult(
            reward, passed, True, res.exit_code, n_pass, n_fail, dropped,
            detail=detail, output=output,
        )  # fmt: skip

    async def _apply(self, sb: DockerSandbox, patch: str, name: str) -> ExecResult:
        await put_files(sb, {name: patch.encode("utf-8", errors="surrogateescape")}, ".")
        cmd = f"cd {REPO_DIR} && git apply --whitespace=nowarn --binary {WORKDIR}/{name}"
        return await sb.exec(["bash", "-c", cmd], timeout_s=60)

    async def _install_tests(self, sb: DockerSandbox, task: SweTask) -> None:
        paths = " ".join(shlex.quote(f"{REPO_DIR}/{p}") for p in task.hidden_tests)
        if paths:  # the patch never touched these paths; remove leftovers anyway
            await sb.exec(["bash", "-c", f"rm -rf -- {paths}"], timeout_s=30)
            await put_files(sb, {p: c.encode() for p, c in task.hidden_tests.items()}, "repo")
        if task.test_patch.strip():
            res = await self._apply(sb, task.test_patch, "test.patch")
            if not res.ok:
                raise GraderError(f"task {task.id!r}: the test patch does not apply")
