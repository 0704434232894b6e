"""@tool / FunctionTool / ToolRegistry: schemas, validation, sync/async/method tools."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

import pytest

from agentrl.tools import FunctionTool, Tool, ToolArgumentError, ToolRegistry, tool


@tool
def search(query: str, limit: int = 5, mode: Literal["web", "news"] = "web") -> list[str]:
    """Searches the index.

    Returns the best matches first.

    Args:
        query: What to look for.
        limit: Most results to return,
            at least one.
        mode: Which index.

    Returns:
        The matching titles.
    """
    return [f"{mode}:{query}"] * limit


def test_schema_of_typed_documented_function() -> None:
    assert search.schema() == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Searches the index.\n\nReturns the best matches first.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to look for."},
                    "limit": {
                        "type": "integer",
                        "description": "Most results to return, at least one.",
                        "default": 5,
                    },
                    "mode": {
                        "enum": ["web", "news"],
                        "type": "string",
                        "description": "Which index.",
                        "default": "web",
                    },
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }


def test_schema_optional_list_and_no_args() -> None:
    @tool
    def tag(items: list[str] | None = None) -> str:
        """Tags items."""
        return ""

    @tool
    def now() -> str:
        """The time."""
        return "noon"

    assert tag.schema()["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "items": {
                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                "default": None,
            }
        },
        "additionalProperties": False,
    }
    assert now.schema()["function"]["parameters"] == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }


def test_name_and_description_overrides() -> None:
    @tool(name="lookup", description="Looks things up.")
    def f(key: str) -> str:
        """Ignored."""
        return key

    assert f.name == "lookup"
    assert f.schema()["function"]["name"] == "lookup"
    assert f.schema()["function"]["description"] == "Looks things up."


def test_parameter_named_like_a_pydantic_attribute() -> None:
    @tool
    def dump(json: str, copy: int = 0) -> str:
        """Echoes."""
        return f"{json}/{copy}"

    assert list(dump.schema()["function"]["parameters"]["properties"]) == ["json", "copy"]


async def test_sync_tool_runs_in_a_thread_and_returns_json() -> None:
    seen: list[int] = []

    @tool
    def where(n: int) -> dict[str, int]:
        """Reports its thread."""
        seen.append(threading.get_ident())
        return {"n": n}

    assert await where.call({"n": 3}) == '{"n":3}'
    assert seen and seen[0] != threading.get_ident()
    assert await search.call({"query": "cat", "limit": 2}) == '["web:cat","web:cat"]'


@dataclass
class Point:
    x: int


async def test_async_tool_and_return_conversion() -> None:
    @tool
    async def point(x: int) -> Point:
        """A point."""
        return Point(x)

    @tool
    async def nothing() -> None:
        """Nothing."""

    assert await point.call({"x": 1}) == '{"x":1}'
    assert await nothing.call({}) == ""
    assert await point(x=2) == Point(2)  # the decorated function is still callable


async def test_arguments_are_validated_and_coerced() -> None:
    assert await search.call({"query": "a", "limit": "2"}) == '["web:a","web:a"]'
    with pytest.raises(ToolArgumentError) as e:
        await search.call({"limit": "many", "colour": 1})
    msg = str(e.value)
    assert msg.startswith("bad arguments for tool 'search': ")
    assert "query: missing required argument" in msg
    assert "limit: Input should be a valid integer" in msg
    assert "colour: unexpected argument" in msg
    with pytest.raises(ToolArgumentError, match="mode: Input should be 'web' or 'news'"):
        await search.call({"query": "a", "mode": "video"})
    with pytest.raises(ToolArgumentError, match="expected a JSON object, got list"):
        await search.call([1, 2])  # type: ignore[arg-type]  # a model may send anything


class Counter:
    def __init__(self, start: int) -> None:
        self.value = start

    @tool
    async def bump(self, by: int = 1) -> int:
        """Adds to the counter.

        Args:
            by: How much to add.
        """
        self.value += by
        return self.value

    @tool(name="peek")
    def read(self) -> int:
        """Reads the counter."""
        return self.value


async def test_method_tools_bind_to_their_instance() -> None:
    a, b = Counter(0), Counter(100)
    assert isinstance(a.bump, FunctionTool)
    assert a.bump.schema()["function"]["parameters"] == {
        "type": "object",
        "properties": {"by": {"type": "integer", "description": "How much to add.", "default": 1}},
        "additionalProperties": False,
    }
    assert await a.bump.call({"by": 2}) == "2"
    assert await b.bump.call({}) == "101"
    assert await a.read.call({}) == "2"
    assert a.read.name == "peek"
    assert a.value == 2 and b.value == 101
    assert await a.bump(5) == 7
    with pytest.raises(TypeError, match="use it through an instance"):
        await Counter.bump.call({})


class Greeter:
    def __init__(self, who: str) -> None:
        self.who = who

    def greet(self, greeting: str) -> str:
        """Greets someone."""
        return f"{greeting}, {self.who}"


async def test_bound_method_can_be_wrapped_directly() -> None:
    t = FunctionTool(Greeter("Ann").greet)
    assert t.name == "greet"
    assert list(t.schema()["function"]["parameters"]["properties"]) == ["greeting"]
    assert await t.call({"greeting": "Hi"}) == "Hi, Ann"
    assert t("Yo") == "Yo, Ann"


def test_functions_that_cannot_be_described_are_rejected() -> None:
    def untyped(x):
        """No hints."""

    def star(*args: int) -> None:
        """Varargs."""

    with pytest.raises(TypeError, match="parameter 'x' has no type annotation"):
        tool(untyped)
    with pytest.raises(TypeError, match=r"\*args/\*\*kwargs"):
        tool(star)


def test_tools_satisfy_the_protocol_and_registry() -> None:
    c = Counter(0)
    reg = ToolRegistry([search, c.bump])
    assert isinstance(search, Tool) and isinstance(c.bump, Tool)
    assert reg.names == ("search", "bump")
    assert "bump" in reg and "nope" not in reg
    assert reg.get("bump") is c.bump
    assert [s["function"]["name"] for s in reg.schemas()] == ["search", "bump"]
    assert reg.subset(["bump"]).names == ("bump",)
    with pytest.raises(KeyError, match="unknown tool 'nope'; registered: search, bump"):
        reg.get("nope")
    with pytest.raises(ValueError, match="already registered"):
        reg.register(search)
    with pytest.raises(TypeError, match="is not a Tool"):
        reg.register(object())  # type: ignore[type-var]  # checked at runtime
