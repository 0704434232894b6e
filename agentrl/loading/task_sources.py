"""A run's task sources (``tasks=`` and ``eval.tasks=``): read, columns mapped, validated.

A source is a task file (``.parquet``, ``.jsonl``, ``.json``: :mod:`~agentrl.loading.task_files`)
or a Hugging Face ``datasets`` source (a ``save_to_disk`` directory, an ``.arrow`` file,
``hf:PATH[:SPLIT]``: :mod:`~agentrl.loading.hf_tasks`). ``task_columns`` maps each row's
columns to the fields the env reads. An env with ``load_tasks`` validates the rows its way:
a plain task file without ``task_columns`` is handed to it as it is; other rows reach it as a
temporary ``.jsonl`` file of the (mapped) rows, named after the source.
"""

from __future__ import annotations

import datetime
import decimal
import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.env import Env
from agentrl.errors import TaskSpecError
from agentrl.loading.hf_tasks import is_hf_source, load_dataset_rows
from agentrl.loading.task_files import read_rows

__all__ = ["DEFAULT_SPLITS", "map_columns", "read_task_source"]

DEFAULT_SPLITS: dict[str, tuple[str, ...]] = {
    "tasks": ("train",),
    "eval.tasks": ("test", "validation"),
}
"""The split a source with several (a ``DatasetDict``) gives when it names none, per
setting, in order of preference."""


def read_task_source(
    source: str,
    *,
    setting: str = "tasks",
    env_cls: type[Env] | None = None,
    columns: Mapping[str, str] | None = None,
    limit: int | None = None,
) -> list[Mapping[str, Any]]:
    """The task rows of ``source``, as the env gets them.

    Args:
        source: A task file, a ``datasets`` source or an ``hf:PATH[:SPLIT]`` spec.
        setting: The config setting that names it (``tasks`` or ``eval.tasks``): named in
            every message, and it picks the split of a ``DatasetDict`` that names none
            (:data:`DEFAULT_SPLITS`).
        env_cls: An env whose ``load_tasks`` validates the rows; None: the rows as they are.
        columns: ``task_columns``: ``{field: column}``; each row becomes exactly these
            fields (empty or None: rows unchanged).
        limit: Use only the first this many rows.

    Raises:
        TaskSpecError: One line naming the setting and the source: a missing path, an
            unreadable or empty source, an unknown split, a row that is not a mapping, a
            mapped column that is missing, or a row the env's ``load_tasks`` refuses.
    """
    columns = dict(columns or {})
    label, name, known = source, Path(source).stem or "tasks", None
    own_file = env_cls is not None and not columns and not is_hf_source(source)
    try:
        if own_file:  # the env reads its own task file, as it is
            assert env_cls is not None
            rows: list[Any] = list(env_cls.load_tasks(source))[:limit]
        elif is_hf_source(source):
            splits = DEFAULT_SPLITS.get(setting, ("train",))
            data = load_dataset_rows(source, splits=splits, limit=limit)
            label, name, known, rows = data.label, data.name, data.columns, data.rows
        else:
            rows = [r for _, r in read_rows(source)][:limit]
    except (OSError, ValueError) as e:  # missing, unreadable or malformed: the user's source
        raise _error(setting, source, e) from e
    where = f"{setting}={label}"
    if own_file:
        if not rows:
            raise TaskSpecError(f"{where}: holds no tasks")
        return rows
    if not rows:
        raise TaskSpecError(f"{where}: holds no rows")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TaskSpecError(
                f"{where}, row {i}: a {type(row).__name__}, not a mapping of fields (column: value)"
            )
    if columns:
        rows = map_columns(rows, columns, where=where, known=known)
    if env_cls is None:
        return list(rows)
    return _validated(env_cls, rows, setting, label, name, columns)


def map_columns(
    rows: Sequence[Mapping[str, Any]],
    columns: Mapping[str, str],
    *,
    where: str,
    known: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """``rows`` with exactly the fields of ``columns`` (``{field: column}``).

    Raises:
        TaskSpecError: A mapped column that the rows (``known``: the dataset's columns)
            do not have, naming it, the columns there are and ``task_columns``.
    """
    if known is not None:
        for field, column in columns.items():
            if column not in known:
                raise TaskSpecError(
                    f"task_columns: no column {column!r} (for field {field!r}) in {where}; "
                    f"its columns: {', '.join(known)}"
                )
    out = []
    for i, row in enumerate(rows):
        for field, column in columns.items():
            if column not in row:
                raise TaskSpecError(
                    f"task_columns: no column {column!r} (for field {field!r}) in {where}, "
                    f"row {i}; its columns: {', '.join(map(str, row))}"
                )
        out.append({field: row[column] for field, column in columns.items()})
    return out


def _error(setting: str, source: str, e: BaseException) -> TaskSpecError:
    """``e`` as a :class:`TaskSpecError` naming the setting (and the source, once)."""
    msg = str(e)
    return TaskSpecError(
        f"{setting}={msg}" if msg.startswith(source) else f"{setting}={source}: {msg}"
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(type(value).__name__)


def _json_line(row: Mapping[str, Any], where: str) -> str:
    try:
        return json.dumps(row, default=_json_default) + "\n"
    except (TypeError, ValueError):
        bad = next(k for k, v in row.items() if not _dumps_ok(v))
        raise TaskSpecError(
            f"{where}: column {bad!r} holds a {type(row[bad]).__name__}, which cannot be "
            "handed to the env's load_tasks (it reads rows of JSON); leave the column out "
            "with task_columns ({field: column} of the columns the env needs)"
        ) from None


def _dumps_ok(value: Any) -> bool:
    try:
        json.dumps(value, default=_json_default)
    except (TypeError, ValueError):
        return False
    return True


def _validated(
    env_cls: type[Env],
    rows: Sequence[Mapping[str, Any]],
    setting: str,
    label: str,
    name: str,
    columns: Mapping[str, str],
) -> list[Mapping[str, Any]]:
    """``rows`` read by the env's ``load_tasks`` from a temporary ``.jsonl`` file; its
    messages name the source instead of that file."""
    lines = [_json_line(r, f"{setting}={label}, row {i}") for i, r in enumerate(rows)]
    with tempfile.TemporaryDirectory(prefix="agentrl-tasks-") as tmp:
        path = Path(tmp) / (re.sub(r"[^\w.-]", "_", name) + ".jsonl")
        path.write_text("".join(lines))
        try:
            tasks = list(env_cls.load_tasks(str(path)))
        except (OSError, ValueError) as e:
            msg = re.sub(re.escape(str(path)) + r"( \(line \d+\))?", lambda _m: label, str(e))
            msg += (
                f" (the rows as task_columns maps them: {dict(columns)})"
                if columns
                else " (task_columns={field: column} maps a source's columns to the env's fields)"
            )
            raise _error(setting, label, ValueError(msg)) from e
    if not tasks:
        raise TaskSpecError(f"{setting}={label}: {env_cls.__name__}.load_tasks gave no tasks")
    return tasks
