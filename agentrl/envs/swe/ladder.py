"""Generated SWE tasks a small model can climb: the ``tiny`` and ``small`` levels.

Every task is a small package with one module whose function has a one-line bug, two
correct neighbours, a visible test the agent may run and hidden tests it never sees:

* ``tiny``: the issue names the file, the function, a failing call, **and the expression
  to replace and its replacement** (the fix is a copy, as retool's tiny problems state
  their expression); the skill is the tool protocol (edit, submit).
* ``small``: the same repositories, the issue names the file, the function and the
  failing call, but not the line: the agent must read the code.

``standard`` is the hand-written built-in set (``agentrl/envs/swe/data``).

Tasks are a pure function of ``(split, seed, level)``: the pool of every combination of
bug, function name and module is shuffled by ``seed`` and cut in two, so held-out tasks
never share a (bug, function, module) triple with training ones. Each task's expected
values come from running its fixed code at generation; every task is checked
gold-passes / empty-fails by :func:`check_locally` in the unit tests and by the Docker
grader with ``python -m agentrl.envs.swe.validate --level tiny``.

    >>> tasks = generate_tasks("train", level="tiny")
    >>> len(tasks) >= 200, tasks[0].id.startswith("tiny-")
    (True, True)
"""

from __future__ import annotations

import difflib
import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .task import SweTask

__all__ = [
    "HELD_OUT",
    "Level",
    "check_locally",
    "generate_tasks",
    "issue_text",
    "ladder_size",
]

HELD_OUT = 64
"""Held-out (``"test"``) tasks per seed; every other combination is a training task."""


class Level(StrEnum):
    """How much the issue gives away (see the module docstring)."""

    TINY = "tiny"
    SMALL = "small"
    STANDARD = "standard"


@dataclass(frozen=True)
class _Bug:
    """One kind of one-line bug: ``args`` are the parameters, ``good``/``bad`` the line."""

    kind: str
    names: tuple[str, ...]
    args: str
    good: str
    bad: str
    calls: tuple[str, ...]  # argument lists; the first one shows the bug in the issue

    @property
    def old(self) -> str:
        """What a tiny issue says to replace: the broken line's expression."""
        return self.bad.removeprefix("return ")

    @property
    def new(self) -> str:
        return self.good.removeprefix("return ")


_BUGS: tuple[_Bug, ...] = (
    _Bug("sum", ("add", "combine", "total"), "a, b", "return a + b", "return a - b",
         ("2, 3", "10, 4", "0, 7", "-1, 1")),
    _Bug("area", ("area", "rect_area", "surface"), "width, height", "return width * height",
         "return width + height", ("3, 4", "5, 5", "2, 10", "1, 1")),
    _Bug("larger", ("larger", "bigger", "pick_max"), "a, b", "return a if a > b else b",
         "return a if a < b else b", ("3, 9", "8, 2", "-4, -1", "6, 6")),
    _Bug("even", ("is_even", "even", "has_even_count"), "n", "return n % 2 == 0",
         "return n % 2 == 1", ("4", "7", "0", "11")),
    _Bug("floor", ("at_least", "raise_to", "lower_bound"), "value, low",
         "return max(value, low)", "return min(value, low)", ("3, 5", "9, 5", "5, 5", "-2, 0")),
    _Bug("inclusive", ("sum_between", "sum_range", "add_span"), "start, stop",
         "return sum(range(start, stop + 1))", "return sum(range(start, stop))",
         ("1, 4", "3, 3", "0, 10", "5, 6")),
    _Bug("mean", ("average", "mean", "mean_of"), "values",
         "return sum(values) / len(values)", "return sum(values) / (len(values) + 1)",
         ("[2, 4, 6]", "[5]", "[1, 2]", "[10, 20, 30, 40]")),
    _Bug("last", ("last", "last_item", "final"), "items", "return items[-1]",
         "return items[0]", ("[1, 2, 3]", "['a', 'b']", "[7]", "[0, 9]")),
    _Bug("percent", ("percent", "as_percent", "share"), "part, whole",
         "return part * 100 / whole", "return part * 10 / whole",
         ("1, 4", "3, 3", "0, 5", "2, 8")),
    _Bug("greet", ("greet", "hello", "welcome"), "name", "return 'Hello, ' + name + '!'",
         "return 'Hello ' + name + '!'", ("'Ada'", "'Bob'", "''", "'Lin'")),
    _Bug("double", ("double", "twice", "times_two"), "x", "return x * 2", "return x * 3",
         ("4", "0", "-3", "10")),
    _Bug("adult", ("is_adult", "can_vote", "of_age"), "age", "return age >= 18",
         "return age > 18", ("18", "30", "17", "5")),
    _Bug("fahrenheit", ("to_fahrenheit", "c_to_f", "fahrenheit"), "celsius",
         "return celsius * 9 / 5 + 32", "return celsius * 9 / 5 - 32",
         ("100", "0", "-40", "37")),
    _Bug("reverse", ("reverse", "backwards", "flip"), "text", "return text[::-1]",
         "return text[1:]", ("'abc'", "'x'", "''", "'stop'")),
    _Bug("head", ("first_n", "take", "head"), "items, n", "return items[:n]",
         "return items[:n - 1]", ("[1, 2, 3], 2", "[5, 6], 1", "[4, 5, 6], 3", "[], 0")),
    _Bug("distance", ("distance", "gap", "abs_diff"), "a, b", "return abs(a - b)",
         "return a - b", ("2, 9", "9, 2", "4, 4", "-3, 3")),
    _Bug("square", ("square", "squared", "sq"), "x", "return x ** 2", "return x * 2",
         ("3", "0", "-4", "5")),
    _Bug("shout", ("shout", "upper", "loud"), "text", "return text.upper()",
         "return text.lower()", ("'hi'", "'Ok'", "''", "'abc'")),
    _Bug("smallest", ("smallest", "lowest", "minimum"), "values", "return min(values)",
         "return max(values)", ("[3, 1, 2]", "[5]", "[-1, 4]", "[9, 8, 7]")),
    _Bug("count", ("count_positive", "positives", "num_positive"), "values",
         "return len([v for v in values if v > 0])",
         "return len([v for v in values if v >= 0])",
         ("[0, 1, 2]", "[-1, 0]", "[3, 4]", "[]")),
)  # fmt: skip

_NEIGHBOURS = (
    ("identity", "x", "return x", ("5", "'a'")),
    ("negate", "x", "return -x", ("5", "-2")),
    ("halve", "x", "return x / 2", ("8", "3")),
    ("size", "items", "return len(items)", ("[1, 2]", "[]")),
    ("join_words", "words", "return ' '.join(words)", ("['a', 'b']", "[]")),
    ("is_empty", "items", "return len(items) == 0", ("[]", "[1]")),
    ("increment", "n", "return n + 1", ("1", "-1")),
    ("strip_text", "text", "return text.strip()", ("' a '", "'b'")),
)

_MODULES = (
    ("shop", "cart"), ("mathkit", "ops"), ("geometry", "shapes"), ("stats", "basic"),
    ("textutil", "strings"), ("billing", "invoice"), ("school", "grades"),
    ("weather", "convert"), ("inventory", "stock"), ("game", "score"),
)  # fmt: skip


def _pool() -> list[tuple[int, int, int]]:
    return [
        (b, n, m)
        for b in range(len(_BUGS))
        for n in range(len(_BUGS[b].names))
        for m in range(len(_MODULES))
    ]


def ladder_size() -> int:
    """How many distinct tasks a level holds (train + held out)."""
    return len(_pool())


def issue_text(func: str, path: str, call: str, got: Any, want: Any,
               fix: tuple[str, str] | None = None) -> str:  # fmt: skip
    """The issue of a generated task; ``fix`` = (old, new) makes it a tiny one."""
    text = (
        f"`{func}` in `{path}` returns the wrong value: `{call}` gives `{got!r}`, "
        f"expected `{want!r}`."
    )
    if fix is not None:
        text += f"\nIn `{path}`, replace `{fix[0]}` with `{fix[1]}`."
    return text


def _call_value(source: str, func: str, args: str) -> Any:
    scope: dict[str, Any] = {}
    exec(source, scope)  # our own generated code, not a user's
    return eval(f"{func}({args})", scope)


def _unified_diff(path: str, old: str, new: str) -> str:
    body = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(body)


def _module(bug: _Bug, func: str, neighbours: Sequence[tuple[str, str, str, tuple[str, ...]]],
            broken: bool) -> str:  # fmt: skip
    parts = [f'"""{func.replace("_", " ").capitalize()} and other helpers."""\n']
    line = bug.bad if broken else bug.good
    defs = [(n, a, b) for n, a, b, _ in neighbours]
    defs.insert(1, (func, bug.args, line))
    for name, args, body in defs:
        parts.append(f"\n\ndef {name}({args}):\n    {body}\n")
    return "".join(parts)


def _make(level: Level, index: int, combo: tuple[int, int, int], rng: random.Random) -> SweTask:
    b, n, m = combo
    bug, func = _BUGS[b], _BUGS[b].names[n]
    pkg, mod = _MODULES[m]
    neighbours = rng.sample(_NEIGHBOURS, 2)
    path = f"{pkg}/{mod}.py"
    good_src = _module(bug, func, neighbours, broken=False)
    bad_src = _module(bug, func, neighbours, broken=True)
    shown = bug.calls[0]
    want, got = _call_value(good_src, func, shown), _call_value(bad_src, func, shown)
    if want == got:  # a template error, caught by the unit tests
        raise AssertionError(f"{bug.kind}: the first call does not show the bug")
    fix = (bug.old, bug.new) if level is Level.TINY else None
    issue = issue_text(func, path, f"{func}({shown})", got, want, fix)
    imp = f"from {pkg}.{mod} import {func}"
    visible = f"{imp}\n\n\ndef test_{func}():\n    assert {func}({shown}) == {want!r}\n"
    hidden_cases = "".join(
        f"    assert {func}({args}) == {_call_value(good_src, func, args)!r}\n"
        for args in bug.calls
    )
    nb_imports = ", ".join(nb[0] for nb in neighbours)
    nb_cases = "".join(
        f"    assert {name}({args}) == {_call_value(good_src, name, args)!r}\n"
        for name, _, _, calls in neighbours
        for args in calls
    )
    hidden = (
        f"{imp}\nfrom {pkg}.{mod} import {nb_imports}\n\n\ndef test_{func}():\n{hidden_cases}"
        f"\n\ndef test_neighbours_unchanged():\n{nb_cases}"
    )
    files = {
        f"{pkg}/__init__.py": "",
        path: bad_src,
        "tests/__init__.py": "",
        f"tests/test_{mod}.py": visible,
        "README.md": f"# {pkg}\n\nSmall helpers. Run the tests with `python3 -m pytest -q`.\n",
    }
    return SweTask(
        id=f"{level.value}-{index:03d}-{pkg}-{func}",
        issue=issue,
        gold_patch=_unified_diff(path, bad_src, good_src),
        hidden_tests={f"tests/hidden/test_{func}_hidden.py": hidden},
        repo_files=files,
        visible_tests=(f"tests/test_{mod}.py",),
        test_timeout_s=30.0,
        metadata={"level": level.value, "bug": bug.kind, "file": path, "function": func},
    )  # fmt: skip


@functools.lru_cache(maxsize=16)
def _split(seed: int, level: Level) -> tuple[tuple[SweTask, ...], tuple[SweTask, ...]]:
    pool = _pool()
    random.Random(seed).shuffle(pool)
    tasks = tuple(
        _make(level, i, combo, random.Random(f"{seed}:{i}")) for i, combo in enumerate(pool)
    )
    return tasks[HELD_OUT:], tasks[:HELD_OUT]


def generate_tasks(split: str = "train", *, seed: int = 0, level: Level | str = "tiny",
                   n: int | None = None) -> list[SweTask]:  # fmt: skip
    """The ``split`` (``"train"`` or ``"test"``) tasks of a generated level.

    Args:
        split: ``"train"`` (every combination not held out) or ``"test"`` (:data:`HELD_OUT`).
        seed: The same (split, seed, level) always gives the same tasks.
        level: ``"tiny"`` or ``"small"`` (see :class:`Level`).
        n: Keep the first ``n``.

    Raises:
        ValueError: Unknown split, or a level that is not generated.
    """
    level = Level(level)
    if level is Level.STANDARD:
        raise ValueError("level 'standard' is the built-in set, not generated (see builtin_tasks)")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    train, test = _split(seed, level)
    tasks = list(train if split == "train" else test)
    return tasks if n is None else tasks[:n]


def check_locally(task: SweTask) -> list[str]:
    """Problems of a generated task found by running it in this process (empty: valid).

    Applies the gold patch by text, then runs every hidden ``test_*`` function against the
    gold and the broken code: gold must pass all, broken must fail one. A quick stand-in
    for the Docker grader (``python -m agentrl.envs.swe.validate``) in unit tests.
    """
    meta = task.metadata
    path, func = meta["file"], meta["function"]
    assert task.repo_files is not None
    bad = task.repo_files[path]
    bug = next(b for b in _BUGS if b.kind == meta["bug"])
    problems = []
    if bad.count(bug.old) != 1:  # what a tiny issue says to replace must be unique
        problems.append(f"{bug.old!r} occurs {bad.count(bug.old)} times in {path}")
    good = bad.replace(bug.bad, bug.good)
    if _unified_diff(path, bad, good) != task.gold_patch:
        problems.append("the gold patch is not the one-line fix")
    hidden = task.hidden_tests[f"tests/hidden/test_{func}_hidden.py"]
    pkg_mod = path[: -len(".py")].replace("/", ".")
    for name, src, want_pass in (("gold", good, True), ("empty", bad, False)):
        passed = _run_tests(hidden, pkg_mod, src)
        if passed != want_pass:
            problems.append(f"the {name} code {'fails' if want_pass else 'passes'} the tests")
    return problems


def _run_tests(test_src: str, module: str, module_src: str) -> bool:
    scope: dict[str, Any] = {}
    exec(module_src, scope)  # our own generated code
    lines = [ln for ln in test_src.splitlines() if not ln.startswith("from ")]
    exec("\n".join(lines), scope)
    tests = [v for k, v in scope.items() if k.startswith("test_") and callable(v)]
    try:
        for t in tests:
            t()
    except AssertionError:
        return False
    return bool(tests)
