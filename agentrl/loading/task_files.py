"""Reading task files: ``.parquet``, ``.jsonl`` or ``.json`` (a list of rows); Hugging Face
``datasets`` sources (a ``save_to_disk`` directory, an ``.arrow`` file, ``hf:PATH[:SPLIT]``)
through :mod:`agentrl.loading.hf_tasks`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.loading.hf_tasks import is_hf_source, read_hf_rows

__all__ = ["TaskFormatError", "read_rows"]


class TaskFormatError(ValueError):
    """A task file or row is malformed; the message names the file, the row and the field."""


def read_rows(path: str | Path) -> list[tuple[str, Any]]:
    """Reads the rows of a task file, each with a source string naming its file (and line).

    A ``datasets`` source (see :mod:`agentrl.loading.hf_tasks`) gives its ``train`` split.

    Raises:
        FileNotFoundError: No such file.
        TaskFormatError: Unknown file type, invalid JSON (naming the line), or a
            ``.json`` file that does not hold a list.
        TaskSpecError: A ``datasets`` source that cannot be read (``datasets`` missing,
            an unknown split, …).
    """
    if is_hf_source(path):
        return read_hf_rows(path)
    p = Path(path)
    if p.is_dir():
        raise TaskFormatError(
            f"{p}: a directory, not a task file nor a datasets save_to_disk directory (no "
            "dataset_dict.json or state.json in it); for a folder of data files use hf:DIR"
        )
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
        f"{p}: unknown task file type {p.suffix!r} (use .parquet, .jsonl, .json, .arrow, a "
        "datasets save_to_disk directory or hf:PATH)"
    )
