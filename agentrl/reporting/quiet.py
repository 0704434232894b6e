"""A quiet console during a run: dependency warnings nobody running agentrl can act on.

Each entry below is one warning, matched by category, the module it is attributed to and
the start of its message, that was seen in a run's own process and is addressed to a
dependency's developers (or to ours), not to the person running ``agentrl train``.
Everything else stays visible: agentrl's own warnings (e.g. ``trainer memory: ...``),
config-related ones, and any dependency warning not listed here.

:func:`quiet_dependency_warnings` installs the filters; a run calls it once at its start
(:func:`agentrl.orchestration.run.train`), never at import of agentrl. The filters win
over ``-W`` / ``PYTHONWARNINGS`` (they are inserted first), so that ``-W error`` does not
turn a dependency's deprecation note into a failed run; they match nothing else.

wandb's own console output is silenced separately, by its settings
(:class:`agentrl.reporting.progress.ProgressLog`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

__all__ = ["DEPENDENCY_WARNINGS", "DependencyWarning", "quiet_dependency_warnings"]


@dataclass(frozen=True)
class DependencyWarning:
    """One dependency warning a run does not show.

    Attributes:
        category: Its class (subclasses match too).
        module: Regex the name of the module it is attributed to must match (anchor
            the end with ``$``: ``warnings`` anchors only the start).
        message: Regex the start of its message must match (case-insensitive).
        why: Where it comes from and why the person running agentrl cannot act on it.
    """

    category: type[Warning]
    module: str
    message: str
    why: str


DEPENDENCY_WARNINGS: tuple[DependencyWarning, ...] = (
    DependencyWarning(
        DeprecationWarning,
        module=r"torch\.jit\._script$",
        message=r"`torch\.jit\.script_method` is deprecated",
        why="torch 2.13 says so once per TorchScript method vLLM 0.32 defines: 14 times "
        "the first time vLLM is imported into the run's process (its tool/reasoning parsers, "
        "agentrl/chat/vllm_parsers.py; its weight-transfer client, "
        "agentrl/inference/weight_sync.py); a note to vLLM's developers. Python's default "
        "filters hide it; -X dev, -W default or a host that enables DeprecationWarnings "
        "shows all 14.",
    ),
)


def quiet_dependency_warnings() -> None:
    """Installs the filters of :data:`DEPENDENCY_WARNINGS` (idempotent: ``warnings``
    keeps one copy of a filter added twice)."""
    for w in DEPENDENCY_WARNINGS:
        warnings.filterwarnings("ignore", message=w.message, category=w.category, module=w.module)
