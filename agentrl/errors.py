"""The errors a run stops with: a user's mistake (:class:`UserError`, one line, no traceback)
or a failed component of the run (:class:`ComponentError`)."""

from __future__ import annotations

__all__ = [
    "ComponentError",
    "DockerUnavailableError",
    "TaskSpecError",
    "TrainerSetupError",
    "UserError",
]


class UserError(Exception):
    """A mistake the user can fix (config, env spec, task file, model directory, missing
    Docker); its message names the cause and the fix. ``agentrl`` prints it as one line
    and exits with status 2 (``--debug`` shows the traceback)."""


class TaskSpecError(UserError, ValueError):
    """The tasks of a run cannot be had: no task file and no built-in tasks, a task file
    missing or malformed, ``task_kwargs`` that do not fit the env."""


class DockerUnavailableError(UserError, RuntimeError):
    """No Docker engine answers (or the ``docker`` package is missing); the message says
    how to start one."""


class TrainerSetupError(UserError, ValueError):
    """A trainer setting that the model or the other settings rule out (named, with why)."""


class ComponentError(RuntimeError):
    """A component of the run (server, trainer, weight sync, env resources) failed; the
    message names it and what was kept."""
