"""Task rows from Hugging Face ``datasets``: ``save_to_disk`` directories, ``.arrow`` files
and ``hf:PATH[:SPLIT]`` specs.

``datasets`` is optional (``pip install 'agentrl[hf]'``): it is imported only when such a
source is read. The sources:

- a directory written by ``Dataset.save_to_disk`` (one dataset) or
  ``DatasetDict.save_to_disk`` (splits; the split is chosen, see ``splits``);
- an ``.arrow`` file (``Dataset.from_file``), e.g. a shard of such a directory;
- ``hf:PATH[:SPLIT]``: PATH a ``save_to_disk`` directory, an ``.arrow`` file, one data file
  (``.parquet``, ``.jsonl``, ``.json``, ``.csv``, ``.tsv``, ``.txt``) or a folder of them
  (``datasets.load_dataset(PATH)``: splits from the file names, e.g. ``train.jsonl`` and
  ``test.jsonl``); anything else is taken for a hub dataset id, which needs the hub.

A source that holds one dataset (a ``Dataset`` directory, an ``.arrow`` file, one data file)
has no splits: all its rows are used, and naming a split is an error.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.errors import TaskSpecError

__all__ = [
    "INSTALL_HINT",
    "DatasetRows",
    "HfSpec",
    "is_hf_source",
    "is_saved_dataset",
    "load_dataset_rows",
    "parse_hf_spec",
    "read_hf_rows",
]

PREFIX = "hf:"
INSTALL_HINT = "pip install 'agentrl[hf]'"
_BUILDERS = {
    ".parquet": "parquet",
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".tsv": "csv",
    ".txt": "text",
}
_SPLIT = re.compile(r"[A-Za-z0-9_][\w.\-]*")
# What a hub dataset id looks like: NAME or OWNER/NAME.
_HUB_ID = re.compile(r"[\w.\-]+(/[\w.\-]+)?")


@dataclass(frozen=True)
class HfSpec:
    """A dataset source: ``path`` (a local path or a hub id) and the ``split`` it names."""

    text: str
    """The source as the user wrote it."""
    path: str
    split: str | None = None


@dataclass(frozen=True)
class DatasetRows:
    """The rows of one split of a dataset source."""

    label: str
    """How messages name the source: as written, with the split chosen for it."""
    name: str
    """A short name of the source (its file or directory name, and split), for ids."""
    split: str | None
    columns: list[str]
    rows: list[dict[str, Any]]


def is_saved_dataset(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory written by ``Dataset``/``DatasetDict.save_to_disk``."""
    p = Path(path)
    return p.is_dir() and ((p / "dataset_dict.json").is_file() or (p / "state.json").is_file())


def is_hf_source(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is read with ``datasets``: an ``hf:`` spec, a ``save_to_disk``
    directory or an ``.arrow`` file."""
    s = os.fspath(path)
    return s.startswith(PREFIX) or Path(s).suffix == ".arrow" or is_saved_dataset(s)


def parse_hf_spec(source: str | os.PathLike[str]) -> HfSpec:
    """``hf:PATH[:SPLIT]`` (or a plain path, which names no split) as an :class:`HfSpec`.

    Raises:
        TaskSpecError: An ``hf:`` spec without a path, or with an empty or malformed split.
    """
    text = os.fspath(source)
    if not text.startswith(PREFIX):
        return HfSpec(text, text)
    body = text[len(PREFIX) :]
    path, split = body, None
    if ":" in body and not os.path.exists(body):
        path, split = body.rsplit(":", 1)
        if not _SPLIT.fullmatch(split):
            raise TaskSpecError(
                f"{text}: bad split {split!r} (write hf:PATH or hf:PATH:SPLIT, "
                "e.g. hf:data/gsm8k:test)"
            )
    if not path:
        raise TaskSpecError(f"{text}: no path (write hf:PATH or hf:PATH:SPLIT, e.g. hf:data/gsm8k)")
    return HfSpec(text, path, split)


def _datasets(source: str) -> Any:
    try:  # optional: only a datasets source needs it
        import datasets
    except ImportError as e:
        raise TaskSpecError(
            f"{source}: reading a Hugging Face dataset needs the datasets package: {INSTALL_HINT}"
        ) from e
    return datasets


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _looks_like_path(path: str) -> bool:
    return (
        path.startswith(("/", ".", "~"))
        or Path(path).suffix in (*_BUILDERS, ".arrow")
        or not _HUB_ID.fullmatch(path)
    )


def _offline() -> bool:
    return any(
        os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE")
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def _open(spec: HfSpec) -> Any:
    """What ``spec`` names: one ``Dataset``, or its splits as ``{name: () -> Dataset}``."""
    datasets = _datasets(spec.text)
    p = Path(spec.path).expanduser()

    def read(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # any failure of the user's data to load
            raise TaskSpecError(f"{spec.text}: cannot read {what}: {_first_line(e)}") from e

    def saved(d: Path) -> Any:
        state = d / "state.json"
        try:  # datasets cannot load a Dataset saved without rows (it wrote no data files)
            empty = state.is_file() and json.loads(state.read_text()).get("_data_files") == []
        except (OSError, ValueError, AttributeError):
            empty = False
        if empty:
            return datasets.Dataset.from_list([])
        return read("this save_to_disk directory", datasets.load_from_disk, str(d))

    if is_saved_dataset(p):
        index = p / "dataset_dict.json"
        if not index.is_file():
            return saved(p)
        try:  # a DatasetDict: only the split used is loaded
            names = [str(n) for n in json.loads(index.read_text())["splits"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TaskSpecError(
                f"{spec.text}: cannot read this save_to_disk directory: {index.name} "
                f"does not list its splits ({_first_line(e)})"
            ) from e
        return {n: functools.partial(saved, p / n) for n in names}
    if p.is_file() and p.suffix == ".arrow":
        return read("this .arrow file", datasets.Dataset.from_file, str(p))
    if p.is_file():
        builder = _BUILDERS.get(p.suffix)
        if builder is None:
            raise TaskSpecError(
                f"{spec.text}: unknown data file type {p.suffix!r} (use a save_to_disk "
                f"directory, .arrow, {', '.join(_BUILDERS)} or a folder of data files)"
            )
        return read(
            "this data file", datasets.load_dataset, builder, data_files=str(p), split="train"
        )
    if p.is_dir():
        return _splits(read("this folder of data files", datasets.load_dataset, str(p)))
    if not spec.text.startswith(PREFIX) or _looks_like_path(spec.path):
        raise FileNotFoundError(f"{spec.text}: {spec.path!r} does not exist")
    # Not here: a hub dataset id (datasets' cache answers it offline when it holds it).
    try:
        return _splits(datasets.load_dataset(spec.path))
    except ConnectionError as e:
        why = (
            "HF_HUB_OFFLINE is set"
            if _offline()
            else f"{_first_line(e)}; HF_HUB_OFFLINE=1 skips the retries"
        )
        raise TaskSpecError(
            f"{spec.text}: {spec.path!r} is no local path, and the Hugging Face hub cannot be "
            f"reached to fetch it as a dataset id ({why}); where the hub is reachable, save "
            f"it with datasets.load_dataset({spec.path!r}).save_to_disk(DIR) and give DIR"
        ) from e
    except Exception as e:
        raise TaskSpecError(
            f"{spec.text}: {spec.path!r} is no local path, and loading it as a hub dataset "
            f"failed: {_first_line(e)}"
        ) from e


def _splits(data: Any) -> Any:
    """A ``DatasetDict`` as ``{name: () -> Dataset}``; a ``Dataset`` as it is."""
    if not hasattr(data, "keys"):
        return data
    return {str(n): functools.partial(data.__getitem__, n) for n in data}


def _split_of(data: Any, spec: HfSpec, splits: Sequence[str]) -> tuple[Any, str | None]:
    """The ``Dataset`` of ``data`` to read, and its split (None: ``data`` holds one)."""
    if not isinstance(data, dict):  # one Dataset
        if spec.split is not None:
            raise TaskSpecError(
                f"{spec.text}: holds one dataset, without splits; drop ':{spec.split}'"
            )
        return data, None
    names = list(data)
    if spec.split is not None:
        if spec.split not in names:
            raise TaskSpecError(
                f"{spec.text}: no split {spec.split!r}; its splits: {', '.join(names) or 'none'}"
            )
        return data[spec.split](), spec.split
    chosen = next((s for s in splits if s in names), None)
    if chosen is None:
        wanted = " or ".join(repr(s) for s in splits)
        raise TaskSpecError(
            f"{spec.text}: no {wanted} split; its splits: {', '.join(names) or 'none'} "
            f"(name one: hf:{spec.path}:{names[0] if names else 'SPLIT'})"
        )
    return data[chosen](), chosen


def load_dataset_rows(
    source: str | os.PathLike[str],
    *,
    splits: Sequence[str] = ("train",),
    limit: int | None = None,
) -> DatasetRows:
    """The rows of a dataset source (see the module docstring), as plain dicts.

    Args:
        source: A ``save_to_disk`` directory, an ``.arrow`` file or an ``hf:`` spec.
        splits: The splits to use, in order of preference, when the source holds several
            and names none.
        limit: Read at most this many rows (the first ones).

    Raises:
        TaskSpecError: ``datasets`` missing, a bad spec, an unknown split (listing the
            splits), a hub id without the hub, or data that ``datasets`` cannot read.
        FileNotFoundError: A local path that does not exist.
    """
    spec = parse_hf_spec(source)
    ds, split = _split_of(_open(spec), spec, splits)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    label = (
        spec.text if split is None or spec.split is not None else f"{spec.text} (split {split!r})"
    )
    p = Path(spec.path).expanduser()
    stem = p.stem if p.is_file() else p.name
    name = f"{stem}-{split}" if split is not None else stem
    rows = ds.with_format(None).to_list()
    return DatasetRows(label, name or "tasks", split, list(ds.column_names), rows)


def read_hf_rows(
    source: str | os.PathLike[str], *, splits: Sequence[str] = ("train",)
) -> list[tuple[str, Any]]:
    """The rows of a dataset source, each with its source string (as
    :func:`agentrl.loading.task_files.read_rows` gives them)."""
    data = load_dataset_rows(source, splits=splits)
    return [(data.label, r) for r in data.rows]
