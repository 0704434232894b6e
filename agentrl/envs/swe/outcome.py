"""What a SWE episode ends with, and the run's warm container pools.

:func:`graded_step` turns a grade into the episode's last StepResult (the ``swe_*``
metrics and info of docs/swe.md); :func:`run_pools` opens the pools a training run shares
(``SweEnv.run_resources``): agents' containers and grading containers, both fresh per
lease, removed with the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from agentrl.sandbox.base import SandboxLimits
from agentrl.sandbox.docker_pool import DockerSandboxPool
from agentrl.types import StepResult

from .grader import GRADER_LIMITS, Grader, GradeResult

__all__ = ["graded_step", "run_pools"]


def graded_step(
    result: GradeResult,
    patch: str,
    task_id: str,
    ended_by: str,
    pool: DockerSandboxPool | None = None,
) -> StepResult:
    """The terminal StepResult of a graded episode.

    Metrics: ``swe_resolved``, ``swe_patch_applied``, ``swe_dropped_paths``,
    ``swe_grade_time_s``, ``swe_patch_lines`` and, with ``pool``, ``swe_pool_busy`` (the
    share of the agents' pool lent out as the episode ends).
    """
    lines = sum(
        1 for ln in patch.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))
    )
    metrics = {
        "swe_resolved": float(result.passed),
        "swe_patch_applied": float(result.applied),
        "swe_dropped_paths": float(len(result.dropped_paths)),
        "swe_grade_time_s": result.duration_s,
        "swe_patch_lines": float(lines),
    }
    if pool is not None:
        metrics["swe_pool_busy"] = pool.metrics()["leased"] / pool.size
    return StepResult(
        reward=result.reward,
        terminated=True,
        metrics=metrics,
        info={
            "swe_task": task_id,
            "swe_ended_by": ended_by,
            "swe_detail": result.detail,
            "swe_dropped_paths": list(result.dropped_paths),
            "swe_tests_passed": result.tests_passed,
            "swe_tests_failed": result.tests_failed,
        },
    )


@contextlib.asynccontextmanager
async def run_pools(
    image: str | None, limits: SandboxLimits, agents: int, graders: int
) -> AsyncIterator[dict[str, Any]]:
    """Yields the env kwargs of the run's pools: ``sandbox_pool`` (``agents`` containers
    with ``limits``) and ``grader`` (a :class:`Grader` over ``graders`` containers)."""
    async with contextlib.AsyncExitStack() as stack:
        out: dict[str, Any] = {}
        if agents:
            pool = DockerSandboxPool(agents, image, limits)
            out["sandbox_pool"] = await stack.enter_async_context(pool)
        if graders:
            gpool = DockerSandboxPool(graders, image, GRADER_LIMITS)
            out["grader"] = Grader(image=image, pool=await stack.enter_async_context(gpool))
        yield out
