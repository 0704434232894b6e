"""RetoolEnv: prompt rendering, step logic on hand-built Actions, the lazy sandbox lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from agentrl import Action, Message, ToolCall
from agentrl.envs.retool import RetoolEnv, TaskFormatError
from agentrl.envs.retool.env import SYSTEM_PROMPT
from agentrl.sandbox.base import ExecResult, SandboxError
from agentrl.testing import check_env

TASK = {"id": "t1", "prompt": "What is 1234 * 5678?", "answer": "7006652"}


class FakeSandbox:
    """A Sandbox stand-in: "runs" code by echoing it, records its lifecycle."""

    def __init__(self, fail: bool = False) -> None:
        self.started = 0
        self.closed = 0
        self.codes: list[str] = []
        self.fail = fail

    async def start(self) -> None:
        await asyncio.sleep(0.01)  # lets concurrent first calls race
        self.started += 1

    async def close(self) -> None:
        self.closed += 1

    async def __aenter__(self) -> FakeSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def exec(self, cmd: Any, **kw: Any) -> ExecResult:
        raise NotImplementedError

    async def run_code(
        self, code: str, *, language: str = "python", timeout_s: float | None = None
    ) -> ExecResult:
        if self.fail:
            raise SandboxError("sandbox died")
        self.codes.append(code)
        return ExecResult(stdout=f"ran: {code}\n", stderr="", exit_code=0)

    async def write_file(self, path: str, data: str | bytes) -> None: ...

    async def read_file(self, path: str) -> bytes:
        return b""


class FakePool:
    def __init__(self) -> None:
        self.sb = FakeSandbox()
        self.lent = 0
        self.returned: list[BaseException | None] = []

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[FakeSandbox]:
        self.lent += 1
        try:
            yield self.sb
        except BaseException as e:
            self.returned.append(e)
            raise
        else:
            self.returned.append(None)


def act(text: str, *calls: ToolCall) -> Action:
    return Action(text=text, content=text, tool_calls=calls)


@pytest.fixture
def sandboxes() -> list[FakeSandbox]:
    """The sandboxes a test's envs made, in order."""
    return []


def make_env(made: list[FakeSandbox], **kw: Any) -> RetoolEnv:
    def factory() -> FakeSandbox:
        made.append(FakeSandbox())
        return made[-1]

    return RetoolEnv(sandbox_factory=factory, **kw)


def test_reset_renders_system_and_user(sandboxes: list[FakeSandbox]) -> None:
    env = make_env(sandboxes)
    msgs = env.reset(TASK)
    assert msgs == [Message.system(SYSTEM_PROMPT), Message.user(TASK["prompt"])]
    assert "\\boxed" in SYSTEM_PROMPT and "python" in SYSTEM_PROMPT
    assert sandboxes == []  # no sandbox before the first tool call


def test_reset_keeps_the_tasks_own_system_message(sandboxes: list[FakeSandbox]) -> None:
    env = make_env(sandboxes)
    task = {
        "prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
        "reward_model": {"ground_truth": "1"},
    }
    assert [m.content for m in env.reset(task)] == ["S", "Q"]


def test_reset_rejects_a_bad_row(sandboxes: list[FakeSandbox]) -> None:
    with pytest.raises(TaskFormatError, match=r"task 't9'.*missing field 'answer'"):
        make_env(sandboxes).reset({"id": "t9", "prompt": "q"})


def test_correct_boxed_answer_terminates_with_reward(sandboxes: list[FakeSandbox]) -> None:
    env = make_env(sandboxes)
    env.reset(TASK)
    r = env.step(act(r"So the product is \boxed{7,006,652}."))
    assert (r.reward, r.terminated, r.truncated) == (1.0, True, False)
    assert r.observation == ()
    assert r.info == {
        "answer": "7006652",
        "reason": "answered",
        "pred": "7,006,652",
        "correct": True,
    }
    assert r.metrics["correct"] == 1.0


def test_wrong_answer_and_format_reward(sandboxes: list[FakeSandbox]) -> None:
    env = make_env(sandboxes)
    env.reset(TASK)
    r = env.step(act(r"\boxed{7006651}"))
    assert (r.reward, r.terminated, r.info["correct"]) == (0.0, True, False)
    env = make_env(sandboxes, format_reward=0.1)
    env.reset(TASK)
    assert env.step(act(r"\boxed{7006651}")).reward == pytest.approx(0.1)


def test_tool_call_without_answer_continues(sandboxes: list[FakeSandbox]) -> None:
    env = make_env(sandboxes)
    env.reset(TASK)
    r = env.step(act("Let me compute.", ToolCall("python", {"code": "print(1234*5678)"}, "c1")))
    assert not r.terminated and not r.truncated
    assert r.reward == 0.0 and list(r.observation) == []
    final = env.step(act(r"\boxed{7006652}"))
    assert final.terminated and final.metrics["tool_calls"] == 1.0


def test_malformed_tool_call_also_continues(sandboxes: list[FakeSandbox]) -> None:
    env = make_env(sandboxes)
    env.reset(TASK)
    bad = Action(text="<tool_call>{oops", parse_errors=("bad JSON",))
    assert not env.step(bad).terminated


def test_no_tool_call_and_no_answer_ends_with_zero(sandboxes: list[FakeSandbox]) -> None:
    env = make_env(sandboxes)
    env.reset(TASK)
    r = env.step(act("I think it is about seven million."))
    assert (r.reward, r.terminated) == (0.0, True)
    assert r.info["reason"] == "no_answer"


def test_boxed_answer_wins_over_tool_calls(sandboxes: list[FakeSandbox]) -> None:
    env = make_env(sandboxes)
    env.reset(TASK)
    r = env.step(act(r"\boxed{7006652}", ToolCall("python", {"code": "print(1)"}, "c1")))
    assert r.terminated and r.reward == 1.0


async def test_python_tool_runs_in_a_lazy_sandbox_closed_by_close(
    sandboxes: list[FakeSandbox],
) -> None:
    env = make_env(sandboxes)
    env.reset(TASK)
    (py,) = env.tools()
    assert py.schema()["function"]["name"] == "python"
    assert sandboxes == []
    outs = await asyncio.gather(*(py.call({"code": f"print({i})"}) for i in range(3)))
    assert outs == [f"ran: print({i})" for i in range(3)]
    assert len(sandboxes) == 1 and sandboxes[0].started == 1  # one sandbox for concurrent calls
    await env.close()
    assert sandboxes[0].closed == 1
    await env.close()  # idempotent
    assert sandboxes[0].closed == 1


async def test_episode_without_tool_calls_never_makes_a_sandbox(
    sandboxes: list[FakeSandbox],
) -> None:
    env = make_env(sandboxes)
    env.reset(TASK)
    env.step(act(r"\boxed{1}"))
    await env.close()
    assert sandboxes == []


async def test_reset_after_close_gets_a_new_sandbox(sandboxes: list[FakeSandbox]) -> None:
    env = make_env(sandboxes)
    env.reset(TASK)
    await env.tools()[0].call({"code": "1"})
    await env.close()
    env.reset(TASK)
    await env.tools()[0].call({"code": "2"})
    assert len(sandboxes) == 2 and sandboxes[1].codes == ["2"]
    await env.close()


async def test_pool_sandbox_is_lent_and_returned() -> None:
    pool = FakePool()
    env = RetoolEnv(sandbox_pool=cast(Any, pool))
    env.reset(TASK)
    await env.tools()[0].call({"code": "x"})
    assert pool.lent == 1 and pool.returned == []
    await env.close()
    assert pool.returned == [None]


async def test_broken_sandbox_is_reported_to_the_pool() -> None:
    pool = FakePool()
    pool.sb.fail = True
    env = RetoolEnv(sandbox_pool=cast(Any, pool))
    env.reset(TASK)
    with pytest.raises(SandboxError):
        await env.tools()[0].call({"code": "x"})
    await env.close()
    assert len(pool.returned) == 1 and isinstance(pool.returned[0], SandboxError)


def test_passes_env_checker(sandboxes: list[FakeSandbox]) -> None:
    check_env(make_env(sandboxes))
    check_env(make_env(sandboxes), TASK)


def test_run_resources_only_without_a_given_sandbox_source() -> None:
    assert RetoolEnv.run_resources(sandbox_pool_size=0) is None
    assert RetoolEnv.run_resources(sandbox_factory=FakeSandbox) is None
    assert RetoolEnv.run_resources(sandbox_pool=cast(Any, FakePool())) is None
    with pytest.raises(ValueError, match="sandbox_pool_size"):
        RetoolEnv(sandbox_pool_size=-1)


@pytest.mark.skipif(
    not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("unshare")),
    reason="LocalSandbox needs root and util-linux unshare",
)
async def test_a_run_lends_warm_local_sandboxes_from_one_pool_and_closes_it() -> None:
    """The pool's sandbox starts before any episode asks for it; two episodes in turn get
    it (reset between them: the first's file is gone); it is closed when the run's scope
    ends."""
    scope = RetoolEnv.run_resources(sandbox_pool_size=1)
    assert scope is not None
    async with scope as extra:
        pool = extra["sandbox_pool"]
        for _ in range(3000):  # warmed in the background (0.2-0.5 s here; up to 30 s)
            if pool.metrics["idle"] == 1:
                break
            await asyncio.sleep(0.01)
        assert (pool.metrics["idle"], pool.metrics["acquired"]) == (1, 0)
        printed = []
        for code in ("open('/tmp/mark', 'w').write('x'); print('made')",
                     "import os; print(os.path.exists('/tmp/mark'))"):  # fmt: skip
            env = RetoolEnv(**extra)
            printed.append((await env.sandbox.run_code(code)).stdout.strip())
            await env.close()
        await asyncio.sleep(0.5)  # the returned sandbox is reset in the background
        m = pool.metrics
        assert printed == ["made", "False"]  # nothing of the first episode reaches the second
        assert (m["created"], m["acquired"], m["replaced"]) == (1, 2, 0)  # one sandbox, lent twice
    assert pool.metrics["closed"] == 1
