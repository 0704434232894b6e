"""check_env_on_tasks: the env checker run on a user's own task rows.

:func:`~agentrl.testing.check_env` checks an env on one task (its ``example_task``); this
runs it on every row of a task source, read as a training run reads ``tasks=`` (the env's
``load_tasks`` included), and names the row (and the field) that breaks the env.

Example:
    >>> from agentrl import Env, StepResult
    >>> class Echo(Env):
    ...     def reset(self, task, *, seed=None):
    ...         return task["prompt"]
    ...     def step(self, action):
    ...         return StepResult(reward=1.0, terminated=True)
    >>> check_env_on_tasks(Echo, [{"prompt": "hi"}])
    []
    >>> check_env_on_tasks(Echo, [{"prompt": "hi"}, {"question": "?"}])
    Traceback (most recent call last):
    ...
    agentrl.testing.env_checker.EnvCheckError: tasks, row 1: Echo: reset(task, seed=0) raised \
KeyError: 'prompt'; the row has no field 'prompt' (its fields: question)
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.env import Env, provides
from agentrl.loading.task_sources import read_task_source
from agentrl.testing.env_checker import EnvCheckError, EnvCheckWarning, check_env

__all__ = ["check_env_on_tasks"]


def check_env_on_tasks(
    env: type[Env],
    tasks: str | Sequence[Any],
    *,
    label: str = "tasks",
    limit: int | None = None,
    seed: int = 0,
) -> list[str]:
    """Checks ``env`` (a class made with no arguments) on each task; returns the warnings.

    Args:
        env: The env class; a fresh instance checks each row.
        tasks: A task source as ``tasks=`` takes it (a ``.jsonl``/``.json``/``.parquet``
            file, a ``datasets`` directory or ``hf:PATH[:SPLIT]``), read through the env's
            ``load_tasks`` if it has one; or the tasks themselves, as ``reset`` gets them.
        label: How messages name the tasks (``tasks=FILE`` for a source).
        limit: Check only the first this many rows.
        seed: The seed of every check episode.

    Raises:
        EnvCheckError: ``"LABEL, row I: ..."``: a row that is not a mapping, or one the env
            breaks on; a missing field is named with the fields the row has.
        TaskSpecError: The source cannot be read (missing, malformed, refused by ``load_tasks``).
    """
    if isinstance(tasks, str):
        own = env if provides(env, "load_tasks") else None
        rows = read_task_source(tasks, env_cls=own, limit=limit)
        label = f"tasks={tasks}" if label == "tasks" else label
    else:
        rows = list(tasks)[:limit]
    if not rows:
        raise EnvCheckError(f"{label}: no tasks to check")
    found: list[str] = []
    for i, row in enumerate(rows):
        where = f"{label}, row {i}"
        if not isinstance(row, Mapping):
            raise EnvCheckError(
                f"{where}: a {type(row).__name__}, not a mapping of fields (field: value)"
            )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", EnvCheckWarning)
            try:
                check_env(env, row, seed=seed)
            except EnvCheckError as e:
                raise EnvCheckError(f"{where}: {e}{_missing_field(e, row)}") from e
        warned = []
        for w in caught:  # the checker's own are collected, any other passes through
            if issubclass(w.category, EnvCheckWarning):
                warned.append(str(w.message))
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        found += [w for w in warned if w not in found]
    return found


def _missing_field(e: BaseException, row: Mapping[str, Any]) -> str:
    """``"; the row has no field 'x' (its fields: ...)"`` when ``e`` came of a missing key."""
    cause = e.__cause__
    if isinstance(cause, KeyError) and cause.args:
        key = cause.args[0]
        if isinstance(key, str) and key not in row:
            fields = ", ".join(map(str, row)) or "none"
            return f"; the row has no field {key!r} (its fields: {fields})"
    return ""
