"""Env registry: turns an ``--env`` spec into an :class:`~agentrl.env.Env` subclass.

A spec is one of:

* a registered or built-in name: ``retool`` (built-ins are the subpackages of
  ``agentrl.envs``, i.e. the repo's ``envs/`` folder, plus the ``agentrl.envs``
  entry-point group of installed packages);
* ``pkg.module:ClassName`` (an importable module);
* ``path/to/file.py:ClassName`` (a file, loaded as a module);
* ``gym:ENV_ID`` (a gymnasium env with text observations, wrapped by
  :class:`~agentrl.adapters.gym.GymnasiumEnv`);
* ``verifiers:ENV_ID`` (a verifiers environment, :mod:`agentrl.adapters.verifiers`);
* ``skyrl:NAME`` (a skyrl-gym env, :mod:`agentrl.adapters.skyrl`).

The adapter schemes (``gym``, ``verifiers``, ``skyrl``) win over a module of the same
name: for a class in such a module write ``pkg.module:Class`` with its full module path.

Example:
    >>> from agentrl import Env
    >>> @register_env("doc-echo")
    ... class Echo(Env):
    ...     pass
    >>> resolve_env("doc-echo") is Echo
    True
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, overload

from agentrl.env import Env
from agentrl.loading.modules import import_file

__all__ = [
    "ADAPTER_SCHEMES",
    "ENTRY_POINT_GROUP",
    "EnvNotFoundError",
    "InvalidEnvError",
    "env_preset",
    "list_envs",
    "register_env",
    "resolve_env",
]

ENTRY_POINT_GROUP = "agentrl.envs"
"""Entry-point group through which installed packages publish envs (``name = "pkg.mod:Cls"``)."""

_BUILTIN_PACKAGE = "agentrl.envs"
_REGISTRY: dict[str, type[Env] | str] = {}

ADAPTER_SCHEMES: dict[str, str] = {
    "gym": "agentrl.adapters.gym:gym_env_class",
    "verifiers": "agentrl.adapters.verifiers:verifiers_env_class",
    "skyrl": "agentrl.adapters.skyrl:skyrl_env_class",
}
"""``SCHEME:ID`` env specs: the scheme's adapter function (``"module:function"``, imported
on first use because the frameworks are heavy imports) takes ID and returns an Env class; its
ImportError (the framework is missing) or LookupError (no such ID) becomes EnvNotFoundError."""


class EnvNotFoundError(LookupError):
    """No env matches the spec; the message lists the available ones."""


class InvalidEnvError(TypeError):
    """The spec names something that is not an :class:`Env` subclass."""


@overload
def register_env(
    name: str, env: None = None, *, replace: bool = ...
) -> Callable[[type[Env]], type[Env]]: ...


@overload
def register_env(name: str, env: type[Env] | str, *, replace: bool = ...) -> type[Env] | str: ...


def register_env(
    name: str, env: type[Env] | str | None = None, *, replace: bool = False
) -> Callable[[type[Env]], type[Env]] | type[Env] | str:
    """Registers an env class (or a lazy ``"pkg.module:Class"`` string) under ``name``.

    Use as ``@register_env("name")`` on a class, or call ``register_env("name", cls)``.

    Raises:
        ValueError: ``name`` is taken by a different env and ``replace`` is False.
        InvalidEnvError: ``env`` is a class that does not subclass :class:`Env`.
    """

    def add(target: Any) -> Any:
        if not isinstance(target, str):
            _check_env_class(target, f"register_env({name!r})")
        old = _REGISTRY.get(name)
        if old is not None and not replace and not _same(old, target):
            raise ValueError(f"an env named {name!r} is already registered ({_describe(old)})")
        _REGISTRY[name] = target
        return target

    if env is None:
        return add
    return add(env)  # add returns its argument


def list_envs() -> list[str]:
    """Names of all registered, built-in and entry-point envs, sorted."""
    return sorted(set(_REGISTRY) | set(_builtin_names()) | set(_entry_points()))


def resolve_env(spec: str) -> type[Env]:
    """Returns the :class:`Env` subclass that ``spec`` names (see the module docstring).

    Raises:
        EnvNotFoundError: Nothing matches; the message lists the available envs.
        InvalidEnvError: The spec resolves to something that is not an Env subclass.
    """
    spec = spec.strip()
    if not spec:
        raise EnvNotFoundError(_not_found_message(spec))
    scheme, sep, rest = spec.partition(":")
    if sep and scheme in ADAPTER_SCHEMES:
        return _adapter_env_class(scheme, rest.strip())
    if ":" in spec:
        return _resolve_target(spec)
    return _resolve_name(spec)


# ----------------------------------------------------------------------------- names


def _resolve_name(name: str) -> type[Env]:
    if name in _REGISTRY:
        return _load_registered(name)
    if name in _builtin_names():
        module = f"{_BUILTIN_PACKAGE}.{name}"
        try:
            mod = importlib.import_module(module)  # registers its env on import
        except ImportError as e:
            raise EnvNotFoundError(f"built-in env {name!r} failed to import: {e}") from e
        if name in _REGISTRY:
            return _load_registered(name)
        return _single_env_in(mod, spec=name)
    eps = _entry_points()
    if name in eps:
        try:
            obj = eps[name].load()
        except Exception as e:
            raise EnvNotFoundError(
                f"env {name!r} (entry point {eps[name].value!r}) failed to load: {e}"
            ) from e
        return _check_env_class(obj, name)
    raise EnvNotFoundError(_not_found_message(name))


def _load_registered(name: str) -> type[Env]:
    target = _REGISTRY[name]
    if isinstance(target, str):
        cls = _resolve_target(target)
        _REGISTRY[name] = cls
        return cls
    return target


def _builtin_names() -> list[str]:
    """Subpackages of ``agentrl.envs`` (found without importing them)."""
    try:
        pkg = importlib.import_module(_BUILTIN_PACKAGE)
    except ImportError:
        return []
    paths = getattr(pkg, "__path__", None)
    if paths is None:
        return []
    return [m.name for m in pkgutil.iter_modules(paths) if m.ispkg and not m.name.startswith("_")]


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _not_found_message(spec: str) -> str:
    available = list_envs()
    msg = f"unknown env {spec!r}."
    close = difflib.get_close_matches(spec, available, n=1, cutoff=0.6)
    if close:
        msg += f" Did you mean {close[0]!r}?"
    msg += f" Available envs: {', '.join(available) or '(none)'}."
    msg += " User envs: 'pkg.module:ClassName' or 'path/to/file.py:ClassName'"
    msg += "; other frameworks' envs: " + ", ".join(f"'{k}:ID'" for k in ADAPTER_SCHEMES) + "."
    if "." in spec and ":" not in spec:
        module, _, attr = spec.rpartition(".")
        msg += f" (for a class in a module write '{module}:{attr}')"
    return msg


# ----------------------------------------------------------------------------- targets


def _resolve_target(spec: str) -> type[Env]:
    """Resolves ``module:Class`` or ``file.py:Class``."""
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise EnvNotFoundError(
            f"bad env spec {spec!r}: expected 'pkg.module:ClassName' or 'path/to/file.py:ClassName'"
        )
    if where.endswith(".py") or "/" in where or "\\" in where:
        module = import_file(where, spec, kind="env", error=EnvNotFoundError)
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as e:
            if e.name is not None and where.startswith(e.name):
                raise EnvNotFoundError(
                    f"env spec {spec!r}: no module named {e.name!r} (is it installed or on "
                    f"PYTHONPATH?). {_not_found_message(spec)}"
                ) from e
            raise  # the module exists but one of its own imports is missing
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            candidates = _env_classes_in(module)
            hint = f" Env classes there: {', '.join(candidates)}." if candidates else ""
            raise EnvNotFoundError(f"env spec {spec!r}: {where} has no attribute {part!r}.{hint}")
        obj = getattr(obj, part)
    return _check_env_class(obj, spec)


def _env_classes_in(module: Any) -> list[str]:
    return [
        n
        for n, v in vars(module).items()
        if inspect.isclass(v) and issubclass(v, Env) and v is not Env and not n.startswith("_")
    ]


def _single_env_in(module: Any, *, spec: str) -> type[Env]:
    names = [
        n
        for n in _env_classes_in(module)
        if getattr(module, n).__module__.startswith(module.__name__)
    ]
    if len(names) == 1:
        return _check_env_class(getattr(module, names[0]), spec)
    raise EnvNotFoundError(
        f"built-in env package {module.__name__} neither registers an env named {spec!r} "
        f"nor defines exactly one Env subclass (found: {', '.join(names) or 'none'})"
    )


def _check_env_class(obj: Any, spec: str) -> type[Env]:
    if inspect.isclass(obj) and issubclass(obj, Env):
        return obj
    what = f"class {obj.__module__}.{obj.__qualname__}" if inspect.isclass(obj) else repr(obj)[:80]
    raise InvalidEnvError(
        f"env spec {spec!r} resolves to {what}, which is not a subclass of agentrl.Env "
        "(subclass agentrl.Env and implement reset(task, *, seed=None) and step(action))"
    )


def env_preset(spec: str) -> Path | None:
    """The YAML preset the env named by ``spec`` declares (:attr:`Env.preset`), or None.

    The path is relative to the file that defines the env class.

    Raises:
        EnvNotFoundError, InvalidEnvError: As :func:`resolve_env`.
        InvalidEnvError: The env declares a preset that is not a file.
    """
    cls = resolve_env(spec)
    if not cls.preset:
        return None
    try:
        path = Path(inspect.getfile(cls)).parent / cls.preset
    except TypeError as e:  # a class without a file
        raise InvalidEnvError(f"env {spec!r} declares preset {cls.preset!r} but has no file") from e
    if not path.is_file():
        raise InvalidEnvError(f"env {spec!r} declares preset {cls.preset!r}, but {path} is missing")
    return path


def _adapter_env_class(scheme: str, env_id: str) -> type[Env]:
    if not env_id:
        raise EnvNotFoundError(
            f"bad env spec '{scheme}:': expected '{scheme}:ID', e.g. gym:FrozenLake-v1"
        )
    module, _, func = ADAPTER_SCHEMES[scheme].partition(":")
    make = getattr(importlib.import_module(module), func)
    try:
        cls = make(env_id)
    except (ImportError, LookupError) as e:  # the framework is missing, or has no such env
        raise EnvNotFoundError(f"env spec '{scheme}:{env_id}': {e}") from e
    return _check_env_class(cls, f"{scheme}:{env_id}")


def _same(a: type[Env] | str, b: type[Env] | str) -> bool:
    """The same env: one object, one spec, or one class in one file imported twice."""
    if a is b or _describe(a) == _describe(b):
        return True
    if isinstance(a, str) or isinstance(b, str) or a.__qualname__ != b.__qualname__:
        return False
    try:
        return inspect.getfile(a) == inspect.getfile(b)
    except TypeError:  # classes without a file
        return False


def _describe(target: type[Env] | str) -> str:
    return target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
