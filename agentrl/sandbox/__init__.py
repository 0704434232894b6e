"""agentrl.sandbox: isolated places to run model-written code (docs/sandboxes.md).

``make_sandbox("local", limits=SandboxLimits(...))`` builds a backend by name;
``SandboxPool(lambda: make_sandbox("local"), size=8)`` keeps warm ones ready.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.sandbox.base import (
    ExecResult,
    ForkableSandbox,
    Sandbox,
    SandboxError,
    SandboxLimits,
    fork_sandbox,
)
from agentrl.sandbox.local import LocalSandbox
from agentrl.sandbox.pool import SandboxPool

__all__ = [
    "SANDBOX_KINDS",
    "ExecResult",
    "ForkableSandbox",
    "LocalSandbox",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxPool",
    "fork_sandbox",
    "make_sandbox",
    "register_sandbox",
]


def _docker(**kwargs: Any) -> Sandbox:
    # Imported on use: the docker SDK is only needed by runs that choose this backend.
    from agentrl.sandbox.docker import DockerSandbox

    return DockerSandbox(**kwargs)


#: kind -> constructor; backends register themselves here.
SANDBOX_KINDS: dict[str, Callable[..., Sandbox]] = {"local": LocalSandbox, "docker": _docker}


def register_sandbox(kind: str, factory: Callable[..., Sandbox]) -> None:
    """Makes ``make_sandbox(kind, ...)`` build sandboxes with ``factory``."""
    SANDBOX_KINDS[kind] = factory


def make_sandbox(kind: str, **kwargs: Any) -> Sandbox:
    """Builds a (not yet started) sandbox of a registered kind with the given arguments."""
    try:
        factory = SANDBOX_KINDS[kind]
    except KeyError:
        raise ValueError(
            f"unknown sandbox kind {kind!r}; valid kinds: {', '.join(sorted(SANDBOX_KINDS))}"
        ) from None
    return factory(**kwargs)
