"""Worked SWE episodes shown before the task, for a model that must learn the tool format.

Up to three solved tiny issues as prior turns, in the Hermes tool-call format: fix the
expression with ``str_replace``, then ``submit``. The tool outputs are what the env's
editor prints for those repositories (a unit test renders them with the real
:class:`~agentrl.envs.swe.editor.Editor` and compares).

Why edit → submit and not view → edit → test → submit: SmolLM2-135M copies the shorter
protocol far more often (its first call was the right ``str_replace`` in 17% of samples
at temperature 0.7 with three short examples; a view-first example sent it to viewing).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.types import Message

from .ladder import issue_text
from .workspace import REPO_DIR

__all__ = ["WORKED", "worked_example_messages", "worked_files"]

WORKED: tuple[tuple[str, str, str, str, Any, Any, str, str], ...] = (
    # path, function, parameters, call, got, want, old, new
    ("geometry/shapes.py", "perimeter", "width, height", "perimeter(3, 2)", 2, 10,
     "2 * (width - height)", "2 * (width + height)"),
    ("textkit/words.py", "exclaim", "text", "exclaim('hi')", "hi?", "hi!",
     "text + '?'", "text + '!'"),
    ("bank/fees.py", "fee", "amount", "fee(200)", 20.0, 2.0, "amount / 10", "amount / 100"),
)  # fmt: skip
"""The solved examples, in the order shown."""


def worked_files(i: int) -> dict[str, str]:
    """Example ``i``'s repository before the fix (path → text)."""
    path, func, params, *_, old, _new = WORKED[i]
    doc = func.capitalize()
    return {path: f'"""{doc} and other helpers."""\n\n\ndef {func}({params}):\n    return {old}\n'}


def _numbered(text: str) -> str:
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(text.splitlines(), 1))


def _call(name: str, arguments: dict[str, Any]) -> Message:
    return Message.assistant(
        f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
    )


def worked_example_messages(n: int, prompt: Callable[[str, Sequence[str]], str]) -> list[Message]:
    """The first ``n`` (0-3) worked episodes as prior turns; ``prompt(issue, visible_tests)``
    is the env's own first user message, so each example reads like the real task."""
    if not 0 <= n <= len(WORKED):
        raise ValueError(f"worked_examples must be 0..{len(WORKED)}, got {n}")
    out: list[Message] = []
    for i in range(n):
        path, func, _, call, got, want, old, new = WORKED[i]
        (before,) = worked_files(i).values()
        test = f"tests/test_{path.rsplit('/', 1)[1]}"
        edited = _numbered(before.replace(old, new))
        out += [
            Message.user(prompt(issue_text(func, path, call, got, want, (old, new)), (test,))),
            _call("str_replace_editor",
                  {"command": "str_replace", "path": path, "old_str": old, "new_str": new}),
            Message.tool(
                f"The file {REPO_DIR}/{path} has been edited. Lines 1-5 now read:\n{edited}"
            ),
            _call("submit", {}),
            Message.tool("Submitted; your changes will be graded."),
        ]  # fmt: skip
    return out
