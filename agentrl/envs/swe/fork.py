"""SweEnv.fork: a branch of an episode, with its own copy of the agent's container.

The child continues from the parent's state: the same task, turn and idle counts, the
repository's files (a fork of the container, :meth:`DockerSandbox.fork`), the same base
commit and a copy of the editor's undo history. It gets its own container, editor, tools
and lock, so each branch is graded on its own diff at ``submit``. A container lent from
the run's pool stays the parent's: the child's fork is its own, removed when it closes.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Protocol, TypeVar

from agentrl.env import EnvForkError
from agentrl.sandbox.base import SandboxError
from agentrl.sandbox.docker import DockerSandbox
from agentrl.tools.base import FunctionTool

from .editor import Editor
from .workspace import SandboxFS, lost

__all__ = ["fork_episode"]


class _Episode(Protocol):
    """The state of a SweEnv that a fork copies or replaces."""

    sandbox: DockerSandbox | None
    _editor: Editor | None
    _lock: asyncio.Lock
    _from_pool: bool
    _lost: str | None


E = TypeVar("E", bound=_Episode)


async def fork_episode(env: E) -> E:
    """A copy of ``env`` in its current state with a forked container (module docstring).

    Raises:
        EnvForkError: No episode is running (``reset`` not called, or closed).
        SandboxLostError: The agent's container failed before or during the fork (the
            reason; no container of the child is left).
    """
    sb, editor = env.sandbox, env._editor
    if sb is None or editor is None:
        raise EnvForkError("swe (SweEnv) cannot fork: no episode is running (call reset() first)")
    if env._lost is not None or sb.dead:
        raise await lost("forking the agent's container", env._lost or "it is marked dead")
    async with env._lock:  # no tool call of the parent changes the files while they copy
        try:
            forked = await sb.fork()
        except SandboxError as e:
            raise await lost("forking the agent's container", e) from e
    child = copy.copy(env)
    state = vars(child)
    for name, value in list(state.items()):
        if isinstance(value, FunctionTool):  # a tool bound to the parent (tools/base.py)
            del state[name]
    child.sandbox, child._from_pool, child._lock = forked, False, asyncio.Lock()
    child._editor = editor.fork(SandboxFS(forked))
    return child
