"""RetoolEnv.fork: the child gets a sandbox of its own (a copy of the parent's files, or an
unstarted one), and its python tool acts on it; the interpreter's state forks by the files."""

from __future__ import annotations

import pytest

from agentrl.env import fork_problem
from agentrl.envs.retool import RetoolEnv
from agentrl.sandbox import LocalSandbox, SandboxError
from tests.helpers.sandbox import LIMITS, namespaces_work

TASK = {"id": "t1", "prompt": "What is 1234 * 5678?", "answer": "7006652"}


class Fake:
    def __init__(self, made: list[Fake]) -> None:
        made.append(self)
        self.codes: list[str] = []
        self.closed = 0

    async def start(self) -> None: ...

    async def close(self) -> None:
        self.closed += 1

    async def run_code(self, code, *, language="python", timeout_s=None):
        from agentrl.sandbox.base import ExecResult

        self.codes.append(code)
        return ExecResult(stdout="ok\n", stderr="", exit_code=0)


async def test_a_fork_before_any_code_gets_its_own_unstarted_sandbox() -> None:
    made: list[Fake] = []
    env = RetoolEnv(sandbox_factory=lambda: Fake(made))
    env.reset(TASK)
    assert fork_problem(env) is None and fork_problem(RetoolEnv) is None
    child = await env.fork()
    assert made == [] and not child.sandbox.started and child.sandbox is not env.sandbox
    await child.tools()[0].call({"code": "print(1)"})
    await env.tools()[0].call({"code": "print(2)"})
    assert [f.codes for f in made] == [["print(1)"], ["print(2)"]]  # one sandbox each
    assert child.task is env.task
    await child.close()
    await env.close()
    assert [f.closed for f in made] == [1, 1]


@pytest.mark.skipif(not namespaces_work(), reason="LocalSandbox needs namespaces")
async def test_a_fork_copies_the_files_then_parent_and_child_diverge() -> None:
    env = RetoolEnv(sandbox_factory=lambda: LocalSandbox(LIMITS))
    env.reset(TASK)
    py = env.tools()[0]
    await py.call({"code": "open('state.txt', 'w').write('x = 41')"})
    child = await env.fork()
    try:
        cpy = child.tools()[0]
        assert cpy is not py
        await cpy.call({"code": "open('state.txt', 'a').write(' + 1')"})
        read = "print(open('state.txt').read())"
        assert await cpy.call({"code": read}) == "x = 41 + 1"
        assert await py.call({"code": read}) == "x = 41"  # the parent's files are its own
    finally:
        await child.close()
        await env.close()
    assert child.sandbox.closed and env.sandbox.closed


async def test_a_started_sandbox_that_cannot_fork_refuses_by_name() -> None:
    made: list[Fake] = []
    env = RetoolEnv(sandbox_factory=lambda: Fake(made))
    env.reset(TASK)
    await env.tools()[0].call({"code": "print(1)"})
    with pytest.raises(SandboxError, match=r"Fake cannot fork: it defines no fork\(\)"):
        await env.fork()
    assert await env.tools()[0].call({"code": "print(2)"}) == "ok"  # the parent goes on
    await env.close()
    assert [f.closed for f in made] == [1]
