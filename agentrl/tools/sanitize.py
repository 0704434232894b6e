"""Text that can always be tokenized: lone surrogates replaced at the tool and env boundary.

A Python ``str`` may hold lone UTF-16 surrogates (``"\\udc00"``: from ``surrogateescape``
decoding of bytes, a JSON ``\\udc00`` escape, or a tool that builds one), which cannot be
encoded as UTF-8, so tokenizers raise on them. Tool output and env observations pass
through :func:`scrub_text` / :func:`scrub_messages` before they reach the chat template:
a surrogate pair becomes its character, a lone surrogate becomes U+FFFD, and the number
replaced is returned so the caller can record it.

Example:
    >>> scrub_text("ok\\udc00")
    ('ok\ufffd', 1)
    >>> scrub_text("\\ud83d\\ude00")
    ('😀', 0)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from agentrl.types import Message

__all__ = ["scrub_messages", "scrub_text"]


def scrub_text(text: str) -> tuple[str, int]:
    """``text`` with surrogate pairs joined and lone surrogates replaced; (text, how many)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return text, 0  # the common case: nothing to do
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return joined, joined.count("\ufffd") - text.count("\ufffd")


def _scrub_opt(text: str | None) -> tuple[str | None, int]:
    return (None, 0) if text is None else scrub_text(text)


def scrub_messages(messages: Iterable[Message]) -> tuple[list[Message], int]:
    """Each message's text fields scrubbed (see :func:`scrub_text`); (messages, replaced)."""
    out: list[Message] = []
    total = 0
    for m in messages:
        content, n1 = scrub_text(m.content)
        reasoning, n2 = scrub_text(m.reasoning)
        call_id, n3 = _scrub_opt(m.tool_call_id)
        name, n4 = _scrub_opt(m.name)
        n = n1 + n2 + n3 + n4
        if n:
            m = replace(m, content=content, reasoning=reasoning, tool_call_id=call_id, name=name)
        out.append(m)
        total += n
    return out, total
