"""check_env: checks a user's Env the way gymnasium's env checker checks a gym env.

It runs two short episodes (reset + one step with a dummy action, same seed) and
checks the types of what comes back, determinism under a seed, the tool schemas
and ``close()``. Hard problems raise :class:`EnvCheckError`; soft ones warn
with :class:`EnvCheckWarning`.

Example:
    >>> from agentrl import Env, Message, StepResult
    >>> class Hi(Env):
    ...     def reset(self, task, *, seed=None):
    ...         return [Message.user("Say hi.")]
    ...     def step(self, action):
    ...         return StepResult(reward=float("hi" in action.text), terminated=True)
    >>> check_env(Hi())
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import difflib
import inspect
import math
import numbers
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.env import HOOKS, Env, call_maybe_async, provides
from agentrl.types import Action, Message, StepResult

__all__ = ["DUMMY_ACTION", "EnvCheckError", "EnvCheckWarning", "acheck_env", "check_env"]

DUMMY_ACTION = Action(text="Hello.", content="Hello.")
"""The action the checker steps with (plain text, no tool calls)."""

_ROLES = frozenset({"system", "user", "assistant", "tool"})
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class EnvCheckError(AssertionError):
    """The env breaks the Env contract; the message says where and how."""


class EnvCheckWarning(UserWarning):
    """The env works but does something likely unintended."""


def check_env(
    env: Env | type[Env], task: Mapping[str, Any] | None = None, *, seed: int = 0
) -> None:
    """Checks ``env`` (an instance, or a class made with no arguments), sync or async.

    Args:
        env: The env to check.
        task: The task to reset with; default: ``env.example_task()`` if the env
            defines it, else ``{}``.
        seed: The seed both check episodes use.

    Raises:
        EnvCheckError: The env breaks the contract.
    """
    coro = acheck_env(env, task, seed=seed, _emit=False)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        found = asyncio.run(coro)
    else:  # called from inside an event loop: run the check on a loop of its own
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            found = pool.submit(asyncio.run, coro).result()
    for msg in found:
        warnings.warn(msg, EnvCheckWarning, stacklevel=2)


async def acheck_env(
    env: Env | type[Env],
    task: Mapping[str, Any] | None = None,
    *,
    seed: int = 0,
    _emit: bool = True,
) -> list[str]:
    """Async form of :func:`check_env`; returns the warnings (and emits them unless told not to)."""
    checker = _Checker(env, task, seed)
    await checker.run()
    if _emit:
        for msg in checker.warnings:
            warnings.warn(msg, EnvCheckWarning, stacklevel=2)
    return checker.warnings


class _Checker:
    def __init__(self, env: Env | type[Env], task: Mapping[str, Any] | None, seed: int) -> None:
        if inspect.isclass(env):
            cls = env
            if not issubclass(cls, Env):
                raise EnvCheckError(f"{cls.__qualname__} does not subclass agentrl.Env")
            try:
                env = cls()
            except Exception as e:
                raise EnvCheckError(
                    f"{cls.__qualname__}() raised {type(e).__name__}: {e}; "
                    "pass an instance to check an env whose constructor needs arguments"
                ) from e
        if not isinstance(env, Env):
            raise EnvCheckError(f"{type(env).__qualname__} is not an agentrl.Env (subclass it)")
        self.env = env
        self.name = type(env).__qualname__
        self.seed = seed
        self.task = task
        self.warnings: list[str] = []

    def fail(self, msg: str) -> EnvCheckError:
        return EnvCheckError(f"{self.name}: {msg}")

    def warn(self, msg: str) -> None:
        self.warnings.append(f"{self.name}: {msg}")

    async def run(self) -> None:
        self.check_class()
        task = await self.pick_task()
        first = await self.episode(task, 1)
        second = await self.episode(task, 2)
        self.check_same(first, second, task)
        self.check_tools()
        for i in (1, 2):  # close() must work, and a second call must not fail either
            try:
                await call_maybe_async(self.env.close)
            except Exception as e:
                if i == 1:
                    raise self.fail(f"close() raised {type(e).__name__}: {e}") from e
                self.warn(f"a second close() raised {type(e).__name__}: {e}; make it idempotent")

    def check_class(self) -> None:
        cls = type(self.env)
        if cls.reset is Env.reset:
            raise self.fail("does not implement reset(task, *, seed=None)")
        if cls.step is Env.step:
            raise self.fail("does not implement step(action)")
        params = inspect.signature(self.env.reset).parameters
        if "seed" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise self.fail(
                "reset() must accept a keyword argument seed: reset(task, *, seed=None)"
            )
        if not isinstance(self.env.max_turns, int) or self.env.max_turns < 1:
            raise self.fail(f"max_turns must be a positive int, got {self.env.max_turns!r}")
        self.check_hook_names(cls)

    def check_hook_names(self, cls: type) -> None:
        """Warns on a name that is one typo away from an Env hook: it would never be called."""
        known = [n for n in vars(Env) if not n.startswith("_")]
        for klass in cls.__mro__:
            if klass is Env or klass is object:
                continue
            for name in vars(klass):
                if name.startswith("_") or name in known:
                    continue
                near = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
                if near:
                    hook = near[0]
                    kind = "an optional hook" if hook in HOOKS else "a method"
                    self.warn(
                        f"{name!r} is not an Env hook and is never called; did you mean "
                        f"{hook!r} ({kind} of agentrl.Env)?"
                    )

    async def pick_task(self) -> Mapping[str, Any]:
        if self.task is not None:
            return self.task
        own = getattr(self.env, "__dict__", {}).get("example_task")  # set on the instance
        if own is None and not provides(self.env, "example_task"):
            return {}
        example = own if own is not None else self.env.example_task
        task = await call_maybe_async(example) if callable(example) else example
        if not isinstance(task, Mapping):
            raise self.fail(f"example_task() must return a mapping, got {type(task).__name__}")
        return task

    async def episode(self, task: Mapping[str, Any], n: int) -> tuple[list[Message], StepResult]:
        try:
            out = await call_maybe_async(self.env.reset, task, seed=self.seed)
        except Exception as e:
            raise self.fail(f"reset(task, seed={self.seed}) raised {type(e).__name__}: {e}") from e
        msgs = self.check_reset(out)
        try:
            result = await call_maybe_async(self.env.step, DUMMY_ACTION)
        except Exception as e:
            raise self.fail(
                f"step(Action(text={DUMMY_ACTION.text!r})) raised {type(e).__name__}: {e}"
            ) from e
        self.check_step(result, first=n == 1)
        return msgs, result

    def check_reset(self, out: Any) -> list[Message]:
        where = f"reset(task, seed={self.seed})"
        if isinstance(out, str):
            if not out.strip():
                self.warn(f"{where} returned an empty string as the prompt")
            return [Message.user(out)]
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
            raise self.fail(
                f"{where} returned an (observation, info) tuple; return the messages "
                "(a list of agentrl.Message, or a str) instead"
            )
        if not isinstance(out, Sequence) or isinstance(out, bytes):
            raise self.fail(
                f"{where} must return a list of agentrl.Message or a str, got {type(out).__name__}"
            )
        if not out:
            raise self.fail(f"{where} returned no messages; the model needs a prompt")
        msgs = self.check_messages(out, where)
        if msgs[-1].role == "assistant":
            self.warn(f"{where}: the last message is an assistant message; the model answers next")
        return msgs

    def check_messages(self, items: Sequence[Any], where: str) -> list[Message]:
        for i, m in enumerate(items):
            if not isinstance(m, Message):
                raise self.fail(
                    f"{where}[{i}] is a {type(m).__name__} ({m!r:.60}), not an agentrl.Message"
                    + ("; build it with Message.from_dict(...)" if isinstance(m, dict) else "")
                )
            if m.role not in _ROLES:
                raise self.fail(f"{where}[{i}] has role {m.role!r}; use one of {sorted(_ROLES)}")
            if not isinstance(m.content, str):
                raise self.fail(f"{where}[{i}].content is a {type(m.content).__name__}, not a str")
        return list(items)

    def check_step(self, r: Any, *, first: bool) -> None:
        where = "step(action)"
        if isinstance(r, tuple):
            raise self.fail(
                f"{where} returned a tuple of {len(r)}; return agentrl.StepResult(observation=..., "
                "reward=..., terminated=..., truncated=..., info=...) instead of gymnasium's tuple"
            )
        if not isinstance(r, StepResult):
            raise self.fail(f"{where} must return an agentrl.StepResult, got {type(r).__name__}")
        reward = r.reward
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
            raise self.fail(
                f"{where}: reward must be a float, got {type(reward).__name__} {reward!r:.40}"
            )
        if not math.isfinite(float(reward)):
            raise self.fail(f"{where}: reward must be finite, got {reward!r}")
        if not isinstance(reward, float) and first:
            self.warn(f"{where}: reward is a {type(reward).__name__}; return a float")
        for flag in ("terminated", "truncated"):
            value = getattr(r, flag)
            if not isinstance(value, bool):
                raise self.fail(
                    f"{where}: {flag} must be a bool, got {type(value).__name__} {value!r:.40}"
                )
        if not isinstance(r.observation, (list, tuple)):
            raise self.fail(
                f"{where}: observation must be a list of agentrl.Message, "
                f"got {type(r.observation).__name__}"
            )
        self.check_messages(r.observation, f"{where}.observation")
        if not isinstance(r.metrics, dict) or not all(
            isinstance(k, str) and isinstance(v, numbers.Real) for k, v in r.metrics.items()
        ):
            raise self.fail(
                f"{where}: metrics must be a dict of str to numbers, got {r.metrics!r:.80}"
            )
        if not isinstance(r.info, dict):
            raise self.fail(f"{where}: info must be a dict, got {type(r.info).__name__}")
        if first and not (r.terminated or r.truncated) and not r.observation:
            self.warn(
                f"{where}: a plain-text reply without tool calls neither ended the episode nor "
                "produced an observation; the model will be asked again with nothing new"
            )

    def check_same(
        self,
        first: tuple[list[Message], StepResult],
        second: tuple[list[Message], StepResult],
        task: Mapping[str, Any],
    ) -> None:
        (m1, r1), (m2, r2) = first, second
        if m1 != m2:
            diff = next(
                (i for i, (a, b) in enumerate(zip(m1, m2, strict=False)) if a != b),
                min(len(m1), len(m2)),
            )
            raise self.fail(
                f"reset is not deterministic: two reset(task, seed={self.seed}) calls returned "
                f"different messages (first difference at message {diff}: "
                f"{_short(m1, diff)} vs {_short(m2, diff)}); seed every random choice from `seed`"
            )
        for field in ("reward", "terminated", "truncated"):
            a, b = getattr(r1, field), getattr(r2, field)
            if a != b:
                raise self.fail(
                    f"step is not deterministic: the same action after reset(seed={self.seed}) "
                    f"gave {field}={a!r}, then {field}={b!r}"
                )
        if list(r1.observation) != list(r2.observation):
            raise self.fail(
                f"step is not deterministic: the same action after reset(seed={self.seed}) "
                "returned different observations"
            )

    def check_tools(self) -> None:
        try:
            tools = self.env.tools()
        except Exception as e:
            raise self.fail(f"tools() raised {type(e).__name__}: {e}") from e
        if tools is None or isinstance(tools, (str, Mapping)) or not isinstance(tools, Sequence):
            raise self.fail(f"tools() must return a sequence of tools, got {type(tools).__name__}")
        seen: set[str] = set()
        for i, t in enumerate(tools):
            schema = self.tool_schema(t, i)
            name = check_tool_schema(schema, f"tools()[{i}]", self)
            if name in seen:
                raise self.fail(f"two tools are named {name!r}")
            seen.add(name)

    def tool_schema(self, t: Any, i: int) -> Any:
        if isinstance(t, Mapping):
            return t
        schema = getattr(t, "schema", None)
        if not callable(schema):
            raise self.fail(
                f"tools()[{i}] ({t!r:.60}) is not a tool: expected an agentrl.tools Tool "
                "(e.g. made with @tool) or an OpenAI function schema dict"
            )
        try:
            return schema()
        except Exception as e:
            raise self.fail(f"tools()[{i}].schema() raised {type(e).__name__}: {e}") from e


def check_tool_schema(schema: Any, where: str, checker: _Checker) -> str:
    """Checks one OpenAI function schema; returns the tool's name."""
    fail = checker.fail
    if not isinstance(schema, Mapping):
        raise fail(f"{where}: schema must be a dict, got {type(schema).__name__}")
    if schema.get("type") != "function" or not isinstance(schema.get("function"), Mapping):
        raise fail(f'{where}: schema must look like {{"type": "function", "function": {{...}}}}')
    fn = schema["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.match(name):
        raise fail(f"{where}: function.name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}")
    if not isinstance(fn.get("description", ""), str):
        raise fail(f"{where} ({name}): function.description must be a str")
    if not fn.get("description"):
        checker.warn(f"{where} ({name}): no description; the model will not know what it does")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, Mapping) or params.get("type") != "object":
        raise fail(
            f'{where} ({name}): function.parameters must be a JSON schema with "type": "object"'
        )
    props = params.get("properties", {})
    if not isinstance(props, Mapping) or not all(isinstance(v, Mapping) for v in props.values()):
        raise fail(f"{where} ({name}): parameters.properties must map names to JSON schemas")
    required = params.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise fail(f"{where} ({name}): parameters.required must be a list of names")
    missing = [r for r in required if r not in props]
    if missing:
        raise fail(f"{where} ({name}): required names {missing} are not in parameters.properties")
    return name


def _short(msgs: list[Message], i: int) -> str:
    return repr(msgs[i].content[:60]) if i < len(msgs) else "(none)"
