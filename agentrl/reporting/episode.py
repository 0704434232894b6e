"""What an agent reports about its episode beside the reward: metrics and info for its Trajectory.

A bring-your-own agent's ``solve`` returns only the reward; ``report_episode`` lets it add
numbers (aggregated like an env's ``StepResult.metrics``) and anything else (kept in the
trajectory record) to the episode it runs in. The runner collects them with
``collect_episode_report``, which holds the report in a context variable, so it reaches a
sync ``solve`` in its worker thread too. Outside an episode, ``report_episode`` does nothing.

    from agentrl.reporting.episode import report_episode

    async def solve(task, client):
        ...
        report_episode(metrics={"tests_passed": 3.0}, info={"patch": patch})
        return reward
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EpisodeReport", "collect_episode_report", "report_episode"]


@dataclass
class EpisodeReport:
    """Metrics (numbers) and info (anything) an agent reported about its episode."""

    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


_CURRENT: contextvars.ContextVar[EpisodeReport | None] = contextvars.ContextVar(
    "agentrl_episode_report", default=None
)


def report_episode(
    metrics: Mapping[str, float] | None = None, info: Mapping[str, Any] | None = None
) -> None:
    """Adds ``metrics`` and ``info`` to the current episode's Trajectory (later keys win).

    Raises:
        TypeError: A metric is not a number.
    """
    report = _CURRENT.get()
    for key, value in (metrics or {}).items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"episode metric {key!r} must be a number, got {value!r}")
        if report is not None:
            report.metrics[key] = float(value)
    if report is not None:
        report.info.update(info or {})


@contextlib.contextmanager
def collect_episode_report() -> Iterator[EpisodeReport]:
    """Collects what ``report_episode`` is given inside the block (and in threads started
    with a copy of its context)."""
    report = EpisodeReport()
    token = _CURRENT.set(report)
    try:
        yield report
    finally:
        _CURRENT.reset(token)
