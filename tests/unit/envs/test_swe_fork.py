"""SweEnv.fork with a sandbox double: what the child copies, what it gets of its own, and
the pool's container staying the parent's (real Docker: tests/integration/test_swe_fork.py)."""

from __future__ import annotations

from typing import Any

import pytest

from agentrl.env import EnvForkError, fork_problem
from agentrl.envs.swe import SweEnv, builtin_tasks
from agentrl.envs.swe.editor import Editor, MemoryFS
from agentrl.envs.swe.workspace import REPO_DIR, SandboxFS, SandboxLostError
from agentrl.sandbox.base import SandboxError


@pytest.fixture(autouse=True)
def engine_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Docker engine is asked (the error names the container, not the engine)."""
    monkeypatch.setattr("agentrl.envs.swe.workspace._engine_problem", lambda: None)


class FakeSandbox:
    def __init__(self, fail: bool = False) -> None:
        self.dead, self.closed, self.fail = False, False, fail
        self.children: list[FakeSandbox] = []

    async def fork(self) -> FakeSandbox:
        if self.fail:
            raise SandboxError("fork: archiving the parent's files failed (tar exit 2)")
        child = FakeSandbox()
        self.children.append(child)
        return child

    async def close(self) -> None:
        self.closed = True


class FakePool:
    def __init__(self) -> None:
        self.released: list[Any] = []

    async def release(self, sb: Any) -> None:
        self.released.append(sb)


def mid_episode(sb: FakeSandbox, pool: FakePool | None = None) -> SweEnv:
    env = SweEnv(sandbox_pool=pool)  # type: ignore[arg-type]
    env.task, env.sandbox, env._from_pool = builtin_tasks()[0], sb, pool is not None  # type: ignore[assignment]
    env._editor = Editor(MemoryFS(), REPO_DIR)
    env._editor._history = {f"{REPO_DIR}/a.py": ["old"]}
    env._base, env._turns, env._idle = "abc123", 3, 1
    return env


async def test_child_copies_the_episode_state_and_owns_its_sandbox() -> None:
    parent_sb, pool = FakeSandbox(), FakePool()
    env = mid_episode(parent_sb, pool)
    parent_tools = env.tools()  # bound (and cached) on the parent before the fork
    child = await env.fork()
    (child_sb,) = parent_sb.children
    assert child.sandbox is child_sb and env.sandbox is parent_sb
    assert (child.task, child._base, child._turns, child._idle) == (env.task, "abc123", 3, 1)
    assert child._lock is not env._lock
    assert child._editor is not None and env._editor is not None
    assert isinstance(child._editor.fs, SandboxFS) and child._editor.fs.sandbox is child_sb
    assert child._editor._history == env._editor._history
    child._editor._history[f"{REPO_DIR}/a.py"].append("new")
    child._turns += 1
    assert env._editor._history[f"{REPO_DIR}/a.py"] == ["old"] and env._turns == 3
    child_tools = child.tools()
    assert [t._self for t in child_tools] == [child] * 3
    assert [t._self for t in parent_tools] == [env] * 3
    # The pool's container stays the parent's: the child's fork is closed, not returned.
    await child.close()
    assert child_sb.closed and pool.released == [] and not parent_sb.closed
    await env.close()
    assert pool.released == [parent_sb]


async def test_branches_are_independent() -> None:
    parent_sb = FakeSandbox()
    env = mid_episode(parent_sb)
    a, b = await env.fork(), await env.fork()
    assert len({id(a.sandbox), id(b.sandbox), id(parent_sb)}) == 3
    a._submitted = True
    assert not b._submitted and not env._submitted
    await b.close()
    assert parent_sb.children[1].closed and not parent_sb.children[0].closed


async def test_failed_fork_ends_the_branch_with_the_reason() -> None:
    env = mid_episode(FakeSandbox(fail=True))
    with pytest.raises(SandboxLostError, match=r"forking the agent.s container.*tar exit 2"):
        await env.fork()
    assert env.sandbox is not None and not env._lock.locked()


async def test_dead_or_missing_sandbox_refuses() -> None:
    with pytest.raises(EnvForkError, match=r"swe \(SweEnv\) cannot fork: no episode"):
        await SweEnv().fork()
    sb = FakeSandbox()
    env = mid_episode(sb)
    sb.dead = True
    with pytest.raises(SandboxLostError, match="marked dead"):
        await env.fork()
    assert sb.children == []


def test_swe_env_declares_it_can_fork() -> None:
    assert SweEnv.forkable is True
    assert fork_problem(SweEnv) is None and fork_problem(SweEnv()) is None
