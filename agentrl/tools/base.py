"""The Tool protocol and ``@tool``: a typed, documented Python function as a tool.

The JSON schema (OpenAI function-calling format) is built by pydantic from the
function's signature; descriptions come from its Google-style docstring.

Example:
    >>> @tool
    ... def add(a: int, b: int = 1) -> int:
    ...     '''Adds two integers.
    ...
    ...     Args:
    ...         a: The first number.
    ...         b: The second number.
    ...     '''
    ...     return a + b
    >>> add.schema()["function"]["parameters"]["required"]
    ['a']
    >>> import asyncio
    >>> asyncio.run(add.call({"a": 2, "b": 3}))
    '5'
    >>> add(2, 3)  # still the plain function
    5
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, overload, runtime_checkable

import docstring_parser
import pydantic
import pydantic_core
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from agentrl.tools.threads import default_tool_threads

__all__ = ["FunctionTool", "Tool", "ToolArgumentError", "to_text", "tool"]


class ToolArgumentError(ValueError):
    """The arguments of a tool call do not fit the tool's schema."""


@runtime_checkable
class Tool(Protocol):
    """Anything the model can call.

    Attributes:
        name: The name the model calls it by.
        description: What it does, shown to the model.
    """

    name: str
    description: str

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema: ``{"type": "function", "function": {...}}``."""
        ...

    async def call(self, arguments: dict[str, Any]) -> str:
        """Validates ``arguments``, runs the tool and returns its output as text.

        Raises:
            ToolArgumentError: The arguments do not fit the schema.
        """
        ...


class _SchemaGenerator(GenerateJsonSchema):
    """pydantic's JSON schema without generated titles, keys in natural order."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        out = super().model_schema(schema)
        out.pop("title", None)
        return out

    def sort(self, value: JsonSchemaValue, parent_key: str | None = None) -> JsonSchemaValue:
        return value


@dataclass(frozen=True)
class _Spec:
    """What ``@tool`` derives from a function, shared by all bindings of it."""

    name: str
    description: str
    model: type[pydantic.BaseModel]
    params: tuple[tuple[str, str, bool], ...]  # (field name, argument name, positional-only)
    parameters_schema: dict[str, Any]
    is_async: bool


def _clean(text: str | None) -> str:
    return " ".join((text or "").split())


@functools.lru_cache(maxsize=1024)
def _build_spec(func: Callable[..., Any], skip_first: bool) -> _Spec:
    """Builds the argument model and schema of ``func`` (skipping ``self`` when asked)."""
    qual = getattr(func, "__qualname__", repr(func))
    doc = docstring_parser.parse(inspect.getdoc(func) or "")
    arg_docs = {p.arg_name: _clean(p.description) for p in doc.params}
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception as e:
        raise TypeError(f"cannot resolve the type hints of tool {qual}: {e}") from e
    sig_params = list(inspect.signature(func).parameters.values())
    if skip_first:
        sig_params = sig_params[1:]
    fields: dict[str, Any] = {}
    params: list[tuple[str, str, bool]] = []
    for i, p in enumerate(sig_params):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {qual}: *args/**kwargs parameters cannot be described")
        if p.name not in hints:
            raise TypeError(f"tool {qual}: parameter {p.name!r} has no type annotation")
        default = ... if p.default is p.empty else p.default
        # Internal field names avoid clashes with BaseModel attributes ("json", "copy", ...);
        # the alias is the name the model sees.
        field = pydantic.Field(default, alias=p.name, description=arg_docs.get(p.name) or None)
        fields[f"arg{i}"] = (hints[p.name], field)
        params.append((f"arg{i}", p.name, p.kind is p.POSITIONAL_ONLY))
    model = pydantic.create_model(
        f"{getattr(func, '__name__', 'tool')}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **fields,
    )
    parameters = model.model_json_schema(schema_generator=_SchemaGenerator)
    parameters.setdefault("properties", {})
    return _Spec(
        name=getattr(func, "__name__", "tool"),
        description=(doc.description or "").strip(),
        model=model,
        params=tuple(params),
        parameters_schema=parameters,
        is_async=inspect.iscoroutinefunction(func),
    )


def _format_validation_error(name: str, err: pydantic.ValidationError) -> str:
    parts = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(x) for x in e["loc"]) or "arguments"
        if e["type"] == "extra_forbidden":
            parts.append(f"{loc}: unexpected argument")
        elif e["type"] == "missing":
            parts.append(f"{loc}: missing required argument")
        else:
            parts.append(f"{loc}: {e['msg']} (got {e['input']!r:.80})")
    return f"bad arguments for tool {name!r}: " + "; ".join(parts)


def to_text(value: Any) -> str:
    """A tool's return value as text: str as is, None as "", anything else as JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return pydantic_core.to_json(value, fallback=str).decode()


class FunctionTool:
    """A Python function (sync or async, plain or method) as a :class:`Tool`.

    Sync functions run in a thread of :func:`~agentrl.tools.threads.default_tool_threads`
    (not the event loop's default executor), so they neither block the loop nor, when
    stuck, starve env or trainer work.
    Decorating a method gives a descriptor: ``obj.method`` is a tool bound to
    ``obj``, so per-episode tools can use ``self.sandbox``.

    Args:
        func: The function (or bound method) to wrap.
        name: Tool name; defaults to the function's name.
        description: Tool description; defaults to the docstring's text (without
            its Args/Returns sections).
    """

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        bound_self = getattr(func, "__self__", None) if inspect.ismethod(func) else None
        raw = func.__func__ if inspect.ismethod(func) else func
        params = list(inspect.signature(raw).parameters)
        self._is_method = bool(params) and params[0] == "self"
        self._func = raw
        self._self = bound_self
        self._spec = _build_spec(raw, self._is_method)
        self.name = name or self._spec.name
        self.description = self._spec.description if description is None else description
        functools.update_wrapper(self, raw)

    def __repr__(self) -> str:
        bound = " (bound)" if self._self is not None else ""
        return f"<FunctionTool {self.name!r}{bound}>"

    def __set_name__(self, owner: type, attr: str) -> None:
        self._attr: str | None = attr

    def __get__(self, instance: object, owner: type | None = None) -> FunctionTool:
        if instance is None or not self._is_method:
            return self
        bound = object.__new__(type(self))
        bound.__dict__.update(self.__dict__)
        bound._self = instance
        attr = self.__dict__.get("_attr")
        if attr is not None and hasattr(instance, "__dict__"):
            instance.__dict__[attr] = bound  # later lookups find it first: one tool per instance
        return bound

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the wrapped function directly (no validation)."""
        if self._is_method:
            if self._self is None:
                raise TypeError(f"tool {self.name!r} is a method; use it through an instance")
            return self._func(self._self, *args, **kwargs)
        return self._func(*args, **kwargs)

    @property
    def runs_in_thread(self) -> bool:
        """Whether calls run in a tool thread (a sync function) rather than on the loop."""
        return not self._spec.is_async

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self._spec.parameters_schema,
            },
        }

    def validate(self, arguments: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """Checks ``arguments`` against the schema; returns (args, kwargs) for the function.

        Raises:
            ToolArgumentError: The arguments do not fit the schema.
        """
        if not isinstance(arguments, dict):
            raise ToolArgumentError(
                f"bad arguments for tool {self.name!r}: expected a JSON object, "
                f"got {type(arguments).__name__}"
            )
        try:
            parsed = self._spec.model.model_validate(arguments)
        except pydantic.ValidationError as e:
            raise ToolArgumentError(_format_validation_error(self.name, e)) from None
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for field, arg, positional in self._spec.params:
            value = getattr(parsed, field)
            if positional:
                args.append(value)
            else:
                kwargs[arg] = value
        return args, kwargs

    async def call(self, arguments: dict[str, Any]) -> str:
        args, kwargs = self.validate(arguments)
        if self._is_method:
            if self._self is None:
                raise TypeError(f"tool {self.name!r} is a method; use it through an instance")
            args.insert(0, self._self)
        if self._spec.is_async:
            result = await self._func(*args, **kwargs)
        else:
            result = await default_tool_threads().run(self._func, *args, **kwargs)
        return to_text(result)


@overload
def tool(func: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turns a typed, documented function into a :class:`FunctionTool`.

    Use as ``@tool`` or ``@tool(name=..., description=...)``.
    """
    if func is not None:
        return FunctionTool(func, name=name, description=description)
    return lambda f: FunctionTool(f, name=name, description=description)
