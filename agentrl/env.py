"""The Env base class users subclass, and how the AgentLoop calls it.

An env is one small class with ``reset`` and ``step``, sync or async::

    from agentrl import Env, Message, StepResult

    class SayHello(Env):
        def reset(self, task, *, seed=None):
            return [Message.user("Say hello.")]

        def step(self, action):
            return StepResult(reward=float("hello" in action.text.lower()), terminated=True)

Sync methods run in a worker thread so they never block the event loop.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Awaitable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar

from agentrl.types import Action, Message, StepResult

__all__ = ["HOOKS", "Env", "EnvForkError", "call_maybe_async", "fork_problem", "provides"]

HOOKS: tuple[str, ...] = (
    "load_tasks",
    "default_tasks",
    "example_task",
    "preflight",
    "run_resources",
    "demonstrations",
)
"""The optional hooks of :class:`Env`: agentrl calls one only where the env class defines it."""


def provides(env: Any, hook: str) -> bool:
    """Whether ``env`` (a class or an instance) defines the optional ``hook`` itself.

    A hook inherited from :class:`Env` is not provided: its default only documents it.

    Example:
        >>> class Quiz(Env):
        ...     @staticmethod
        ...     def default_tasks(split="train", n=8, seed=0):
        ...         return [{"q": i} for i in range(n)]
        >>> provides(Quiz, "default_tasks"), provides(Quiz, "load_tasks")
        (True, False)
    """
    cls = env if isinstance(env, type) else type(env)
    for klass in cls.__mro__:
        if hook in vars(klass):
            return klass is not Env
    return False


class EnvForkError(TypeError):
    """An env cannot fork (:meth:`Env.fork`); the message names the env and the reason."""


def _env_name(cls: type) -> str:
    name = getattr(cls, "name", None)
    return f"{name} ({cls.__qualname__})" if name and name != cls.__qualname__ else cls.__qualname__


def _children(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, Mapping):
        return [(f"[{k!r}]", v) for k, v in value.items()]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    attrs = dict(getattr(value, "__dict__", {}))
    for klass in type(value).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if isinstance(slot, str) and hasattr(value, slot):
                attrs.setdefault(slot, getattr(value, slot))
    return [(f".{k}", v) for k, v in attrs.items()]


def _uncopyable(value: Any, path: str, depth: int = 4) -> tuple[str, Any, BaseException] | None:
    """The deepest part of ``value`` (its path, the part, the error) that deepcopy refuses."""
    try:
        copy.deepcopy(value)
    except Exception as e:
        if depth > 0:
            for key, child in _children(value):
                found = _uncopyable(child, path + key, depth - 1)
                if found is not None:
                    return found
        return path, value, e
    return None


def fork_problem(env: type[Env] | Env) -> str | None:
    """Why ``env`` (a class, or an instance in its current state) cannot fork, or None.

    A run with tree rollouts asks this before it starts and stops with the reason. A class
    that sets ``forkable`` or overrides :meth:`Env.fork` answers for itself; otherwise an
    instance is tried with ``copy.deepcopy`` (a class alone: None, decided at the fork).

    Example:
        >>> import threading
        >>> class Locked(Env):
        ...     def __init__(self):
        ...         self.lock = threading.Lock()
        >>> print(fork_problem(Locked()))  # doctest: +ELLIPSIS
        Locked cannot fork: self.lock holds a _thread.lock, which cannot be deep-copied ...
    """
    cls = env if isinstance(env, type) else type(env)
    if cls.forkable is False:
        return f"{_env_name(cls)} cannot fork: it sets forkable = False"
    if cls.forkable or provides(cls, "fork") or isinstance(env, type):
        return None
    return _copy_problem(env)


def _copy_problem(env: Env) -> str | None:
    cls = type(env)
    found = _uncopyable(env, "self")
    if found is None:
        return None
    path, part, err = found
    kind = f"{type(part).__module__}.{type(part).__qualname__}".removeprefix("builtins.")
    return (
        f"{_env_name(cls)} cannot fork: {path} holds a {kind}, which cannot be deep-copied "
        f"({type(err).__name__}: {err}); override {cls.__qualname__}.fork() to copy or "
        "recreate it (an env holding a sandbox forks it), or set forkable = False"
    )


async def call_maybe_async(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Awaits ``fn(*args, **kwargs)`` if it is a coroutine function, else runs it in a thread."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result


class Env:
    """Base class of environments.

    Subclasses implement :meth:`reset` and :meth:`step` (plain or ``async def``).

    Class attributes:
        name: Registry name (``agentrl train --env NAME``); defaults to the class name.
        max_turns: Default turn budget of an episode (the run config may lower it).
        preset: A YAML run preset, relative to the file that defines the class, that
            ``agentrl train --env NAME`` (and ``eval``, ``doctor config``) start from
            when no ``--config`` is given; None: the config's built-in defaults.
        stages: The stages of each model turn (``agentrl.rollout.stages.Stage``, e.g.
            think then answer); empty: the run config's ``rollout.stages``.
        process_rewards: True when the rewards :meth:`step` gives before the last turn
            grade that turn (per-turn, "process" supervision): with
            ``trainer.advantage.supervision: auto``, grpo then credits each turn by its
            own reward. False (the default): any earlier reward only adds to the episode's
            total, and every turn is credited by that total (outcome supervision).
        roles: Names of the parts the model plays in turn (e.g. ``("solver", "checker")``);
            :meth:`role` says which one takes the next turn. Each turn's role is recorded
            (``TurnSpan.role``); with ``trainer.lora.per_role`` each role is its own LoRA
            policy over one base, and each turn's request asks for its role's adapter.
            Empty (the default): one part.
        forkable: Whether :meth:`fork` works for every instance: True (say so, e.g. after
            overriding it), False (never: a run with tree rollouts stops before it starts,
            naming the env), None (the default: an env that overrides :meth:`fork` can;
            otherwise its state is tried, see :func:`fork_problem`).

    An env that calls tools exposes them through :meth:`tools`; the AgentLoop runs
    the model's tool calls with them and passes the results in ``Action.tool_results``
    before calling :meth:`step`.

    Optional hooks (:data:`HOOKS`) are declared here so they can be seen and their names
    checked (``agentrl doctor env`` warns on a near miss such as ``default_task``); agentrl
    calls one only when the env class defines it (:func:`provides`).
    """

    name: ClassVar[str | None] = None
    max_turns: ClassVar[int] = 8
    preset: ClassVar[str | None] = None
    stages: ClassVar[Sequence[Any]] = ()
    process_rewards: ClassVar[bool] = False
    roles: ClassVar[tuple[str, ...]] = ()
    forkable: ClassVar[bool | None] = None

    def reset(
        self, task: Mapping[str, Any], *, seed: int | None = None
    ) -> Sequence[Message] | str | Awaitable[Sequence[Message] | str]:
        """Starts an episode on ``task`` and returns the first messages.

        Args:
            task: One task row (e.g. ``{"prompt": ..., "answer": ...}``).
            seed: Seed for any randomness of the env.

        Returns:
            The initial messages (system and user), or a string taken as one user message.
        """
        raise NotImplementedError

    def step(self, action: Action) -> StepResult | Awaitable[StepResult]:
        """Takes the model's turn and returns reward, termination and new messages."""
        raise NotImplementedError

    def role(self) -> str:
        """The role (one of :attr:`roles`) that takes the next model turn; asked before each.

        Plain ``def``, quick (no I/O): it reads the env's own state, e.g. whose turn
        :meth:`step` made it. Default: the first role ("" without roles). A name not in
        :attr:`roles` ends the episode as an env error.

        Example:
            >>> class Duo(Env):
            ...     roles = ("solver", "checker")
            ...     turn = 0
            ...     def role(self):
            ...         return self.roles[self.turn % 2]
            >>> Duo().role()
            'solver'
        """
        return self.roles[0] if self.roles else ""

    def fork(self) -> Env | Awaitable[Env]:
        """A copy of this env in its current state, for a branch of a tree rollout.

        The copy continues the episode on its own: whatever one of them does later does
        not change the other. Called between turns (after :meth:`step`), plain or
        ``async def``. The default deep-copies the env (``copy.deepcopy``): right for
        pure-Python state. It refuses (:class:`EnvForkError`, naming the env and the
        attribute) where the state holds what cannot be copied: a socket, a lock, a file,
        a sandbox. Override it to copy such an env, e.g. one holding a sandbox::

            async def fork(self):
                child = copy.copy(self)  # then give it its own copies of what it holds
                child.history = list(self.history)
                child.sandbox = await fork_sandbox(self.sandbox)  # agentrl.sandbox
                return child

        Raises:
            EnvForkError: The env cannot fork (``forkable = False``, or its state cannot
                be deep-copied).
        """
        if self.forkable is False:
            raise EnvForkError(f"{_env_name(type(self))} cannot fork: it sets forkable = False")
        try:
            return copy.deepcopy(self)
        except Exception as e:
            why = _copy_problem(self) or f"{_env_name(type(self))} cannot fork: {e}"
            raise EnvForkError(why) from e

    def tools(self) -> Sequence[Any]:
        """Tools the model may call in this episode (``agentrl.tools.Tool`` objects)."""
        return ()

    @classmethod
    def run_resources(cls, **env_kwargs: Any) -> AbstractAsyncContextManager[Any] | None:
        """Resources every episode of a run shares (e.g. a pool of warm sandboxes).

        Returns None (the default: nothing shared) or an async context manager that a run
        enters once before its first episode and exits when it ends, however it ends. What
        it yields (a mapping, or None) is added to the keyword arguments of every env the
        run makes.
        """
        return None

    def close(self) -> Awaitable[None] | None:
        """Releases the episode's resources; called once per episode, even after an error."""

    # ------------------------------------------------------------------ optional hooks

    @classmethod
    def load_tasks(cls, path: str) -> Sequence[Mapping[str, Any]]:
        """Reads and validates the task file ``path`` (``tasks=PATH``) the env's way.

        Without it, a task file's rows are used as they are. Raise ``ValueError`` naming
        the row for a bad one: the run stops with that message before anything starts.
        """
        raise NotImplementedError(f"{cls.__name__} defines no load_tasks")

    @classmethod
    def default_tasks(cls, *args: Any, **kwargs: Any) -> Sequence[Mapping[str, Any]]:
        """Built-in tasks, called as ``default_tasks(split=..., n=..., seed=..., **task_kwargs)``.

        ``split`` is "train" or "test" (held out). Without it, a run needs ``tasks=PATH``.
        """
        raise NotImplementedError(f"{cls.__name__} defines no default_tasks")

    def example_task(self) -> Mapping[str, Any]:
        """One task row, for ``agentrl.testing.check_env`` and ``agentrl doctor env``."""
        raise NotImplementedError(f"{type(self).__name__} defines no example_task")

    @classmethod
    def preflight(cls, **env_kwargs: Any) -> Awaitable[None] | None:
        """Checks, once before a run starts anything, that the env can work (e.g. that its
        sandbox starts); raise with the cause. Plain or ``async def``."""
        raise NotImplementedError(f"{cls.__name__} defines no preflight")

    @classmethod
    def demonstrations(cls, *args: Any, **kwargs: Any) -> Sequence[Any]:
        """``demonstrations(n, seed=...)``: ``n`` demonstrations (``agentrl.models.demos.Demo``)
        to warm-start a model by SFT."""
        raise NotImplementedError(f"{cls.__name__} defines no demonstrations")
