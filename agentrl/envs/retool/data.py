"""ReTool tasks: a generator of arithmetic word problems, and a loader of verl-style files.

A task row (what ``RetoolEnv.reset`` takes, and one line of a ``.jsonl`` file)::

    {"id": "q1",
     "prompt": [{"role": "user", "content": "What is 48213 * 90071?"}],   # or a plain string
     "reward_model": {"ground_truth": "4342593123"}}                      # or "answer" / "label"

Generated problems need an interpreter (products of 4–6-digit numbers, sums of
large numbers, modular powers, …). Splits are fixed by a hash of the problem
itself, so the train and held-out (``test``) splits never share a problem,
whatever the seeds.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from agentrl.loading.task_files import TaskFormatError, read_rows
from agentrl.types import Message

__all__ = [
    "HELD_OUT_PERCENT",
    "Level",
    "RetoolTask",
    "Split",
    "TaskFormatError",
    "generate_tasks",
    "load_tasks",
    "parse_task",
    "save_tasks",
    "split_of",
]

HELD_OUT_PERCENT = 10
"""Share of the problem space (by hash) that belongs to the held-out split."""


class Split(StrEnum):
    TRAIN = "train"
    TEST = "test"


@dataclass(frozen=True)
class RetoolTask:
    """One validated task.

    Attributes:
        id: Task id (from the row, else ``source:index``).
        messages: The prompt messages.
        answer: The ground-truth answer, as text.
    """

    id: str
    messages: tuple[Message, ...]
    answer: str

    def to_row(self) -> dict[str, Any]:
        """The task as a verl-style row (round-trips through :func:`parse_task`)."""
        return {
            "id": self.id,
            "prompt": [m.to_dict() for m in self.messages],
            "reward_model": {"ground_truth": self.answer},
        }


# ----------------------------------------------------------------------------- parsing

_PROMPT_FIELDS = ("prompt", "messages", "question")
_ANSWER_FIELDS = ("answer", "label", "ground_truth")


def parse_task(
    row: Mapping[str, Any], *, index: int | None = None, source: str = "task"
) -> RetoolTask:
    """Validates one row and returns it as a :class:`RetoolTask`.

    Args:
        row: The row: ``prompt`` (chat messages or a string; ``messages`` and
            ``question`` also work) and the answer in ``reward_model.ground_truth``,
            ``answer``, ``label`` or ``ground_truth``.
        index: The row's index in its file (for error messages).
        source: Where the row comes from (for error messages).

    Raises:
        TaskFormatError: A field is missing or malformed; the message names the row and field.
    """
    where = source if index is None else f"{source}, row {index}"
    if not isinstance(row, Mapping):
        raise TaskFormatError(f"{where}: a task row must be a mapping, got {type(row).__name__}")
    key = next((k for k in _PROMPT_FIELDS if row.get(k) is not None), None)
    if key is None:
        raise TaskFormatError(
            f"{where}: missing field 'prompt' (a list of chat messages or a string; "
            f"'messages' or 'question' also work); the row has {sorted(row)}"
        )
    messages = _parse_messages(row[key], f"{where}: field '{key}'")
    answer = _find_answer(row, where)
    rid = _row_id(row)
    task_id = rid if rid is not None else f"{source}:{index if index is not None else 0}"
    return RetoolTask(id=task_id, messages=messages, answer=answer)


def _row_id(row: Mapping[str, Any]) -> str | None:
    """The row's own id: ``id``, else verl's ``extra_info.index``."""
    if row.get("id") is not None:
        return str(row["id"])
    extra = row.get("extra_info")
    if isinstance(extra, Mapping) and extra.get("index") is not None:
        return str(extra["index"])
    return None


def _parse_messages(value: Any, where: str) -> tuple[Message, ...]:
    if isinstance(value, str):
        if not value.strip():
            raise TaskFormatError(f"{where} is an empty string")
        return (Message.user(value),)
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise TaskFormatError(
            f"{where} must be a list of chat messages or a string, got {type(value).__name__}"
        )
    out = []
    for i, m in enumerate(value):
        if isinstance(m, Message):
            out.append(m)
            continue
        if not isinstance(m, Mapping):
            raise TaskFormatError(f"{where}[{i}] must be a message dict, got {type(m).__name__}")
        for f in ("role", "content"):
            if not isinstance(m.get(f), str):
                raise TaskFormatError(f"{where}[{i}] is missing field '{f}' (a string)")
        out.append(Message(role=m["role"], content=m["content"]))
    if not out:
        raise TaskFormatError(f"{where} is an empty list of messages")
    return tuple(out)


def _find_answer(row: Mapping[str, Any], where: str) -> str:
    candidates: list[tuple[str, Any]] = []
    rm = row.get("reward_model")
    if isinstance(rm, Mapping):
        candidates.append(("reward_model.ground_truth", rm.get("ground_truth")))
    candidates += [(k, row.get(k)) for k in _ANSWER_FIELDS]
    for name, value in candidates:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise TaskFormatError(
                f"{where}: field '{name}' must be a string or a number, got {type(value).__name__}"
            )
        text = str(value).strip()
        if not text:
            raise TaskFormatError(f"{where}: field '{name}' is empty")
        return text
    raise TaskFormatError(
        f"{where}: missing field 'answer' (looked for reward_model.ground_truth, "
        f"{', '.join(_ANSWER_FIELDS)}); the row has {sorted(row)}"
    )


# ----------------------------------------------------------------------------- files


def load_tasks(path: str | Path) -> list[dict[str, Any]]:
    """Reads and validates a ``.parquet``, ``.jsonl`` or ``.json`` (a list) task file.

    Returns:
        The rows as normalized dicts (see :meth:`RetoolTask.to_row`).

    Raises:
        TaskFormatError: A row is malformed (the message names file, row and field).
        FileNotFoundError: No such file.
    """
    p = Path(path)
    rows = read_rows(p)
    out = []
    for i, (source, row) in enumerate(rows):
        task = parse_task(row, index=i, source=source)
        rid = _row_id(row)
        out.append({**task.to_row(), "id": rid if rid is not None else f"{p.stem}-{i}"})
    return out


def save_tasks(rows: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """Writes rows to a ``.jsonl`` or ``.parquet`` file."""
    p = Path(path)
    if p.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist([dict(r) for r in rows]), p)
    elif p.suffix == ".jsonl":
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        raise ValueError(f"{p}: save_tasks writes .jsonl or .parquet")


# ----------------------------------------------------------------------------- generator

_Problem = tuple[str, tuple[int, ...], str, int, str]  # (kind, numbers, question, answer, code)
_Kind = Callable[[random.Random, bool], _Problem]  # (rng, tiny) -> problem


def _digits(rng: random.Random, lo: int, hi: int) -> int:
    n = rng.randint(lo, hi)
    return rng.randint(10 ** (n - 1), 10**n - 1)


def _tiny(
    kind: str, numbers: tuple[int, ...], expr: str, value: int, rng: random.Random
) -> _Problem:
    """A tiny-level problem states its expression, which the solution copies verbatim."""
    q = rng.choice(["What is {e}?", "Compute {e}.", "Calculate {e}.", "Find the value of {e}."])
    return kind, numbers, q.format(e=expr), value, f"print({expr})"


def _product(rng: random.Random, tiny: bool) -> _Problem:
    if tiny:
        a, b = _digits(rng, 2, 3), _digits(rng, 2, 3)
        return _tiny("product", (a, b), f"{a} * {b}", a * b, rng)
    a, b = _digits(rng, 4, 6), _digits(rng, 4, 6)
    q = rng.choice(
        [
            f"A factory makes {a} bolts every day. How many bolts does it make in {b} days?",
            f"A stadium has {a} rows of {b} seats each. How many seats are there in total?",
            f"What is {a} multiplied by {b}?",
        ]
    )
    return "product", (a, b), q, a * b, f"print({a} * {b})"


def _sum(rng: random.Random, tiny: bool) -> _Problem:
    if tiny:
        xs = tuple(_digits(rng, 2, 4) for _ in range(3))
        return _tiny("sum", xs, " + ".join(map(str, xs)), sum(xs), rng)
    xs = tuple(_digits(rng, 6, 9) for _ in range(rng.randint(4, 7)))
    listed = ", ".join(str(x) for x in xs[:-1]) + f" and {xs[-1]}"
    q = rng.choice(
        [
            f"A shop's sales in {len(xs)} months were {listed} dollars. What were its total sales?",
            f"{len(xs)} warehouses hold {listed} items. How many items do they hold in total?",
            f"What is the sum of {listed}?",
        ]
    )
    return "sum", xs, q, sum(xs), f"print({' + '.join(map(str, xs))})"


def _product_minus(rng: random.Random, tiny: bool) -> _Problem:
    if tiny:
        a, b, c = _digits(rng, 2, 2), _digits(rng, 2, 2), _digits(rng, 2, 3)
        return _tiny("product_minus", (a, b, c), f"{a} * {b} - {c}", a * b - c, rng)
    a, b, c = _digits(rng, 4, 5), _digits(rng, 4, 5), _digits(rng, 5, 7)
    q = (
        f"A school buys {a} boxes of {b} pencils each and gives away {c} pencils. "
        "How many pencils are left?"
    )
    return "product_minus", (a, b, c), q, a * b - c, f"print({a} * {b} - {c})"


def _leftover(rng: random.Random, tiny: bool) -> _Problem:
    if tiny:
        total, k = _digits(rng, 3, 4), rng.randint(7, 99)
        return _tiny("leftover", (total, k), f"{total} % {k}", total % k, rng)
    total, k = _digits(rng, 8, 10), rng.randint(101, 9999)
    q = (
        f"{total} marbles are packed in bags of {k}. How many marbles are left over "
        "after filling as many full bags as possible?"
    )
    return "leftover", (total, k), q, total % k, f"print({total} % {k})"


def _power_mod(rng: random.Random, tiny: bool) -> _Problem:
    a, e, m = rng.randint(100, 9999), rng.randint(100, 999), rng.randint(1000, 99999)
    q = f"What is the remainder when {a}^{e} is divided by {m}?"
    return "power_mod", (a, e, m), q, pow(a, e, m), f"print(pow({a}, {e}, {m}))"


def _sum_of_squares(rng: random.Random, tiny: bool) -> _Problem:
    lo = rng.randint(100, 5000)
    hi = lo + rng.randint(100, 5000)
    q = f"What is the sum of the squares of all integers from {lo} to {hi}, inclusive?"
    code = f"print(sum(i * i for i in range({lo}, {hi + 1})))"
    return "sum_of_squares", (lo, hi), q, sum(i * i for i in range(lo, hi + 1)), code


class Level(StrEnum):
    """How hard generated problems are."""

    STANDARD = "standard"
    """Products of 4–6-digit numbers, sums of 4–7 large numbers, modular powers, …"""
    TINY = "tiny"
    """Expressions of 2–4-digit numbers stated as such ("What is 54 * 17 - 23?"):
    what the tiny default model is warm-started on; the answers still need the
    interpreter, and a program that solves one copies the expression."""


_KINDS: dict[Level, tuple[_Kind, ...]] = {
    Level.STANDARD: (
        _product,
        _product,
        _sum,
        _product_minus,
        _power_mod,
        _leftover,
        _sum_of_squares,
    ),
    Level.TINY: (_product, _sum, _product_minus, _leftover),
}


def split_of(kind: str, numbers: Sequence[int]) -> Split:
    """The split a problem belongs to, fixed by a hash of its kind and numbers."""
    key = f"{kind}:{','.join(map(str, numbers))}".encode()
    bucket = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % 100
    return Split.TEST if bucket < HELD_OUT_PERCENT else Split.TRAIN


def generate_tasks(
    n: int, *, split: Split | str = Split.TRAIN, seed: int = 0, level: Level | str = Level.STANDARD
) -> list[dict[str, Any]]:
    """Generates ``n`` distinct arithmetic word problems of one split, deterministically.

    Args:
        n: How many tasks.
        split: ``"train"`` or ``"test"`` (held out: never overlaps ``"train"``).
        seed: The same (n, split, seed, level) always gives the same tasks.
        level: ``"standard"`` or ``"tiny"`` (see :class:`Level`).

    Returns:
        Rows like :meth:`RetoolTask.to_row`, plus ``kind``, ``split`` and ``solution``
        (a reference program that prints the answer).

    Raises:
        ValueError: Unknown split or level.
    """
    split, level = Split(split), Level(level)
    tiny = level is Level.TINY
    rng = random.Random(f"retool:{split}:{seed}" + (":tiny" if tiny else ""))
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, tuple[int, ...]]] = set()
    while len(out) < n:
        kind, numbers, question, answer, code = rng.choice(_KINDS[level])(rng, tiny)
        if split_of(kind, numbers) is not split or (kind, numbers) in seen:
            continue
        seen.add((kind, numbers))
        task = RetoolTask(
            id=f"retool-{split}-{seed}-{len(out)}" + ("-tiny" if tiny else ""),
            messages=(Message.user(question),),
            answer=str(answer),
        )
        out.append({**task.to_row(), "kind": kind, "split": str(split), "solution": code})
    return out
