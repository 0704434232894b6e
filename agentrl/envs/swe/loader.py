"""Loading SWE tasks: the inline row format, task directories, and SWE-bench records.

Formats (details in docs/swe.md):

* a SWE-bench record (``instance_id`` instead of ``id``; optional ``repo_path`` and
  ``env_setup``), read with :func:`from_swebench`;
* a row (a dict, one line of ``.jsonl``, or a ``.json`` file): ``id``, ``issue``,
  ``gold_patch``, one snapshot source (``repo_files`` / ``repo_dir`` / ``image`` +
  ``image_repo_path``), ``hidden_tests`` and/or ``test_patch``, optional
  ``visible_tests``, ``test_command``, ``test_timeout_s``, ``protected``, ``metadata``;
* a task directory: ``task.json`` (the row's other fields), ``repo/`` (the snapshot),
  ``hidden_tests/`` (files at their repository paths), ``gold.patch`` and, if
  ``task.json`` has no ``issue``, ``issue.md``;
* a folder holding any of the above.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .task import SweTask, TaskFormatError, default_test_command

__all__ = [
    "DATA_DIR",
    "as_task",
    "builtin_tasks",
    "from_swebench",
    "load_task_dir",
    "load_tasks",
    "parse_task",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
"""The built-in task set: one ``<id>.json`` row per task."""

_FIELDS = {
    "id",
    "issue",
    "gold_patch",
    "repo_files",
    "repo_dir",
    "image_repo_path",
    "hidden_tests",
    "visible_tests",
    "test_patch",
    "test_command",
    "image",
    "test_timeout_s",
    "protected",
    "metadata",
}


def _get(row: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: str) -> Any:
    value = row.get(key)
    if value is not None and not isinstance(value, types):
        names = types.__name__ if isinstance(types, type) else "/".join(t.__name__ for t in types)
        raise TaskFormatError(f"{where}: field {key!r} must be {names}, got {type(value).__name__}")
    return value


def parse_task(
    row: Mapping[str, Any], *, base_dir: str | Path | None = None, source: str = "task"
) -> SweTask:
    """Validates one inline row and returns it as a :class:`SweTask`.

    Args:
        row: The row (see the module docstring).
        base_dir: Directory a relative ``repo_dir`` is resolved against.
        source: Where the row comes from (for error messages).

    Raises:
        TaskFormatError: A field is missing, unknown or malformed; the message names the task.
    """
    if not isinstance(row, Mapping):
        raise TaskFormatError(f"{source}: a SWE task must be a mapping, got {type(row).__name__}")
    if "instance_id" in row and "id" not in row:  # a SWE-bench record (see from_swebench)
        try:
            return from_swebench(
                row,
                repo_path=str(row.get("repo_path") or "/testbed"),
                env_setup=str(row.get("env_setup") or ""),
            )
        except TaskFormatError as e:
            raise TaskFormatError(f"{source}: {e}") from None
    where = f"{source}: SWE task {row.get('id', '?')!r}"
    unknown = sorted(set(row) - _FIELDS)
    if unknown:
        raise TaskFormatError(f"{where}: unknown field(s) {unknown}; known: {sorted(_FIELDS)}")
    for key in ("id", "issue", "gold_patch"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise TaskFormatError(f"{where}: missing field {key!r} (a non-empty string)")
    repo_dir = _get(row, "repo_dir", str, where)
    if repo_dir is not None:
        path = Path(repo_dir)
        repo_dir = path if path.is_absolute() or base_dir is None else Path(base_dir) / path
    timeout = _get(row, "test_timeout_s", (int, float), where)
    protected = _get(row, "protected", list, where)
    try:
        return SweTask(
            id=row["id"],
            issue=row["issue"],
            gold_patch=row["gold_patch"],
            hidden_tests=dict(_get(row, "hidden_tests", dict, where) or {}),
            repo_files=_get(row, "repo_files", dict, where),
            repo_dir=repo_dir,
            image_repo_path=_get(row, "image_repo_path", str, where),
            visible_tests=tuple(_get(row, "visible_tests", list, where) or ()),
            test_patch=_get(row, "test_patch", str, where) or "",
            test_command=_get(row, "test_command", str, where),
            image=_get(row, "image", str, where),
            test_timeout_s=float(timeout) if timeout is not None else 60.0,
            **({"protected": tuple(protected)} if protected is not None else {}),
            metadata=dict(_get(row, "metadata", dict, where) or {}),
        )
    except TaskFormatError as e:
        raise TaskFormatError(f"{source}: {e}") from None


def load_task_dir(path: str | Path) -> SweTask:
    """Loads a task directory (``task.json``, ``repo/``, ``hidden_tests/``, ``gold.patch``)."""
    root = Path(path)
    meta_file = root / "task.json"
    where = f"task directory {str(root)!r}"
    if not meta_file.is_file():
        raise TaskFormatError(f"{where}: task.json is missing")
    try:
        row = dict(json.loads(meta_file.read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise TaskFormatError(f"{where}: task.json is not a JSON object: {e}") from None
    row.setdefault("id", root.name)
    if "issue" not in row and (root / "issue.md").is_file():
        row["issue"] = (root / "issue.md").read_text()
    if "gold_patch" not in row:
        if not (root / "gold.patch").is_file():
            raise TaskFormatError(f"{where}: gold.patch is missing")
        row["gold_patch"] = (root / "gold.patch").read_text()
    if not any(k in row for k in ("repo_files", "repo_dir", "image_repo_path")):
        row["repo_dir"] = "repo"
    hidden = root / "hidden_tests"
    if "hidden_tests" not in row and hidden.is_dir():
        row["hidden_tests"] = {
            p.relative_to(hidden).as_posix(): p.read_text()
            for p in sorted(hidden.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts
        }
    return parse_task(row, base_dir=root, source=where)


def _load_file(p: Path) -> list[SweTask]:
    if p.suffix == ".jsonl":
        out = []
        for lineno, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskFormatError(f"{p} (line {lineno}): not valid JSON: {e}") from None
            out.append(parse_task(row, base_dir=p.parent, source=f"{p} (line {lineno})"))
        return out
    if p.suffix == ".json":
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"{p}: not valid JSON: {e}") from None
        rows = data if isinstance(data, list) else [data]
        return [parse_task(r, base_dir=p.parent, source=str(p)) for r in rows]
    raise TaskFormatError(f"{p}: unknown task file type {p.suffix!r} (use .jsonl or .json)")


def load_tasks(path: str | Path) -> list[SweTask]:
    """Loads tasks from a ``.jsonl``/``.json`` file, a task directory, or a folder of them.

    Raises:
        FileNotFoundError: No such path.
        TaskFormatError: A task is malformed, or two tasks share an id.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"SWE task path {str(p)!r} does not exist")
    if p.is_file():
        tasks = _load_file(p)
    elif (p / "task.json").is_file():
        tasks = [load_task_dir(p)]
    else:
        tasks = []
        for child in sorted(p.iterdir()):
            if child.is_dir() and (child / "task.json").is_file():
                tasks.append(load_task_dir(child))
            elif child.is_file() and child.suffix in (".json", ".jsonl"):
                tasks.extend(_load_file(child))
        if not tasks:
            raise TaskFormatError(f"{p}: no SWE tasks found (no *.json, *.jsonl or task dirs)")
    seen: set[str] = set()
    for t in tasks:
        if t.id in seen:
            raise TaskFormatError(f"{p}: two tasks have the id {t.id!r}")
        seen.add(t.id)
    return tasks


@functools.cache
def _builtin() -> tuple[SweTask, ...]:
    return tuple(load_tasks(DATA_DIR))


def builtin_tasks() -> list[SweTask]:
    """The built-in task set (``agentrl/envs/swe/data``)."""
    return list(_builtin())


def _id_list(value: Any) -> list[str]:
    if isinstance(value, str):
        value = json.loads(value) if value.strip().startswith("[") else [value]
    return [str(v) for v in value or ()]


def from_swebench(
    record: Mapping[str, Any],
    *,
    repo_path: str = "/testbed",
    test_command: str | None = None,
    env_setup: str = "",
    test_timeout_s: float = 600.0,
) -> SweTask:
    """Adapts a SWE-bench-style instance record with a prebuilt image.

    The record has ``instance_id``, ``repo``, ``base_commit``, ``patch`` (gold),
    ``test_patch``, ``problem_statement``, ``FAIL_TO_PASS``, ``PASS_TO_PASS`` (lists or
    JSON strings) and ``image_name``: an image whose ``repo_path`` holds the repository
    checked out at ``base_commit`` with its dependencies installed. The agent works on a
    copy of it (git history removed); ``test_patch`` is the hidden test change.

    Args:
        record: The instance record.
        repo_path: Where the repository lies inside the image.
        test_command: Command run in the repository copy; default: pytest on the
            FAIL_TO_PASS + PASS_TO_PASS test ids (or the test patch's files); a record's
            own ``test_command`` field wins over the default.
        env_setup: Shell prefix that activates the image's environment, e.g.
            ``source /opt/miniconda3/bin/activate testbed`` for SWE-bench images.
        test_timeout_s: Wall-clock limit of the tests.

    Raises:
        TaskFormatError: A field is missing; the message names the instance.
    """
    iid = record.get("instance_id", "?")
    where = f"SWE-bench record {iid!r}"
    for key in ("instance_id", "patch", "test_patch", "problem_statement", "image_name"):
        if not isinstance(record.get(key), str) or not record[key].strip():
            raise TaskFormatError(f"{where}: missing field {key!r} (a non-empty string)")
    f2p, p2p = _id_list(record.get("FAIL_TO_PASS")), _id_list(record.get("PASS_TO_PASS"))
    command = test_command or record.get("test_command")
    if not command:
        from .patch import patch_paths

        ids = [t for t in f2p + p2p if "::" in t] or patch_paths(record["test_patch"])
        command = default_test_command(ids)
    if env_setup:
        command = f"{env_setup} && {command}"
    return SweTask(
        id=str(iid),
        issue=record["problem_statement"],
        gold_patch=record["patch"],
        test_patch=record["test_patch"],
        image=record["image_name"],
        image_repo_path=repo_path,
        test_command=str(command),
        test_timeout_s=test_timeout_s,
        metadata={
            "repo": record.get("repo"),
            "base_commit": record.get("base_commit"),
            "FAIL_TO_PASS": f2p,
            "PASS_TO_PASS": p2p,
        },
    )


def as_task(value: SweTask | Mapping[str, Any], known: Sequence[SweTask] = ()) -> SweTask:
    """A task from a SweTask, an inline row, or ``{"id": ...}`` naming one of ``known``."""
    if isinstance(value, SweTask):
        return value
    if not isinstance(value, Mapping):
        raise TaskFormatError(f"a SWE task must be a mapping, got {type(value).__name__}")
    if set(value) <= {"id", "task_id"}:
        tid = value.get("id", value.get("task_id"))
        for t in known:
            if t.id == tid:
                return t
        raise TaskFormatError(
            f"unknown SWE task id {tid!r}: not among the {len(known)} known tasks; give the "
            "whole task row (docs/swe.md) or one of the known ids"
        )
    return parse_task(value, source=f"task row {value.get('id', '?')!r}")
