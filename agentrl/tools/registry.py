"""ToolRegistry: tools by name, so configs and executors can refer to them by name.

Example:
    >>> from agentrl.tools import tool
    >>> @tool
    ... def echo(text: str) -> str:
    ...     '''Returns its input.'''
    ...     return text
    >>> reg = ToolRegistry([echo])
    >>> reg.names
    ('echo',)
    >>> reg.get("echo") is echo
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from agentrl.tools.base import Tool

__all__ = ["ToolRegistry"]

T = TypeVar("T", bound=Tool)


class ToolRegistry:
    """An ordered name → :class:`Tool` mapping with clear errors.

    Args:
        tools: Tools to register, in order; names must be unique.
    """

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.register(t)

    def register(self, tool: T, *, replace: bool = False) -> T:
        """Adds ``tool`` under its name and returns it (so it works as a decorator).

        Raises:
            TypeError: ``tool`` does not implement the Tool protocol.
            ValueError: The name is taken and ``replace`` is False.
        """
        if not isinstance(tool, Tool):
            raise TypeError(f"{tool!r} is not a Tool (needs name, description, schema, call)")
        if tool.name in self._tools and not replace:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool:
        """The tool called ``name``.

        Raises:
            KeyError: No such tool; the message lists the registered names.
        """
        try:
            return self._tools[name]
        except KeyError:
            raise KeyError(
                f"unknown tool {name!r}; registered: {', '.join(self._tools) or '(none)'}"
            ) from None

    def subset(self, names: Iterable[str]) -> ToolRegistry:
        """A registry holding only ``names`` (in that order), e.g. the tools a config lists."""
        return ToolRegistry(self.get(n) for n in names)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI schemas of all tools, as a chat template's ``tools=`` takes them."""
        return [t.schema() for t in self._tools.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolRegistry({list(self._tools)})"
