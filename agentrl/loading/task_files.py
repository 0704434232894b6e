"""Reading task files: ``.parquet``, ``.jsonl`` or ``.json`` (a list of rows)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["TaskFormatError", "read_rows"]


class TaskFormatError(ValueError):
    """A task file or row is malformed; the message names the file, the row and the field."""


def read_rows(path: str | Path) -> list[tuple[str, Any]]:
    """Reads the rows of a task file, each with a source string naming its file (and line).

    Raises:
        FileNotFoundError: No such file.
        TaskFormatError: Unknown file type, invalid JSON (naming the line), or a
            ``.json`` file that does not hold a list.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"task file {str(p)!r} does not exist")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(str(p), r) for r in pq.read_table(p).to_pylist()]
    if p.suffix == ".jsonl":
        rows: list[tuple[str, Any]] = []
        for lineno, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((f"{p} (line {lineno})", json.loads(line)))
            except json.JSONDecodeError as e:
                raise TaskFormatError(
                    f"{p} (line {lineno}), row {len(rows)}: not valid JSON: {e}"
                ) from e
        return rows
    if p.suffix == ".json":
        data = json.loads(p.read_text())
        if not isinstance(data, list):
            raise TaskFormatError(f"{p}: a .json task file must hold a list of rows")
        return [(str(p), r) for r in data]
    raise TaskFormatError(
        f"{p}: unknown task file type {p.suffix!r} (use .parquet, .jsonl or .json)"
    )
