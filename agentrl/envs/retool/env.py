r"""RetoolEnv: math with a sandboxed Python interpreter; reward from the final ``\boxed{}`` answer.

One episode: the model may call the ``python`` tool any number of turns (the
AgentLoop runs the calls and appends their results); the first turn with a
``\boxed{…}`` answer ends the episode and is scored against the task's label.
A turn with neither a tool call nor an answer ends it with reward 0.

The sandbox is started on the first tool call (episodes that never run code
never start one) and closed in :meth:`RetoolEnv.close`.

The env forks (tree rollouts, :meth:`RetoolEnv.fork`): the child gets its own sandbox, a
copy of the parent's files (``fork_sandbox``), or an unstarted one when the parent never
ran code. The ``python`` tool runs each call in a fresh interpreter (``python3 -c``), so
its state between calls is the sandbox's files: forking the files forks the interpreter's
state, with nothing to replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from agentrl.builtin_tools.python_interpreter import PythonInterpreter
from agentrl.env import Env
from agentrl.loading.envs import register_env
from agentrl.sandbox import SandboxPool, make_sandbox
from agentrl.sandbox.base import ExecResult, Sandbox, SandboxError, fork_sandbox
from agentrl.types import Action, Message, StepResult

from .data import RetoolTask, Split, generate_tasks, load_tasks, parse_task
from .reward import extract_boxed, score

if TYPE_CHECKING:  # agentrl.models pulls in transformers: only the warm start needs it
    from agentrl.models.demos import Demo

__all__ = ["SYSTEM_PROMPT", "LazySandbox", "RetoolEnv", "worked_example_messages"]

_T = TypeVar("_T")

SYSTEM_PROMPT = (
    "Solve the math problem. You can run Python code with the `python` tool: it returns "
    "what the program prints. Use it for any arithmetic you cannot do exactly in your head. "
    "When you know the answer, write it as \\boxed{ANSWER}."
)

_WORKED = (
    ("What is 37 * 91 - 8?", "print(37 * 91 - 8)", "3359"),
    ("Compute 4821 + 77 + 930.", "print(4821 + 77 + 930)", "5828"),
    ("Find the value of 9137 % 41.", "print(9137 % 41)", "35"),
)


def worked_example_messages(n: int) -> list[Message]:
    """``n`` (at most 3) solved exchanges in the Hermes tool-call format, as prior turns.

    For a small model whose chat template cannot show tools (SmolLM2's ChatML): a
    question, a ``python`` call written as text, the tool's output and the boxed answer
    teach the format by example where a schema in the system message does not.
    """
    if not 0 <= n <= len(_WORKED):
        raise ValueError(f"worked_examples must be 0..{len(_WORKED)}, got {n}")
    out: list[Message] = []
    for question, code, answer in _WORKED[:n]:
        call = json.dumps({"name": "python", "arguments": {"code": code}})
        out += [
            Message.user(question),
            Message.assistant(f"<tool_call>\n{call}\n</tool_call>"),
            Message.tool(answer),
            Message.assistant(f"\\boxed{{{answer}}}"),
        ]
    return out


SandboxFactory = Callable[[], Sandbox | Awaitable[Sandbox]]


class LazySandbox:
    """A Sandbox that gets the real one on first use, and gives it back in :meth:`close`.

    Args:
        factory: Makes an unstarted Sandbox (or an awaitable of one); it is started
            on first use and closed by :meth:`close`. Default: ``make_sandbox("local")``.
        pool: Lend a warm sandbox from this pool instead (returned to it by :meth:`close`).
    """

    def __init__(
        self, factory: SandboxFactory | None = None, *, pool: SandboxPool | None = None
    ) -> None:
        self._factory = factory or (lambda: make_sandbox("local"))
        self._pool = pool
        self._stack = contextlib.AsyncExitStack()
        self._starting: asyncio.Future[Sandbox] | None = None
        self._broken: SandboxError | None = None
        self._closed = False

    @property
    def started(self) -> bool:
        """Whether the real sandbox was requested (and not closed since)."""
        return self._starting is not None

    @property
    def closed(self) -> bool:
        return self._closed

    async def _get(self) -> Sandbox:
        if self._closed:
            raise SandboxError("the sandbox of this episode is closed")
        if self._starting is None:  # concurrent first calls share one start
            self._starting = asyncio.ensure_future(self._make())
        return await asyncio.shield(self._starting)

    async def _make(self) -> Sandbox:
        if self._pool is not None:
            return await self._stack.enter_async_context(self._pool.acquire())
        made = self._factory()
        sandbox = await made if inspect.isawaitable(made) else made
        self._stack.push_async_callback(sandbox.close)
        await sandbox.start()
        return sandbox

    async def _call(self, fn: Callable[[Sandbox], Awaitable[_T]]) -> _T:
        try:
            return await fn(await self._get())
        except SandboxError as e:  # the sandbox itself failed: a pool must not lend it again
            self._broken = e
            raise

    async def start(self) -> None:
        await self._get()

    async def fork(self) -> LazySandbox:
        """A LazySandbox of its own for a forked episode: a fork of the started sandbox
        (``fork_sandbox``: a copy of its files now, owned and closed by the child), or, when
        none was started, an unstarted one from the same factory or pool.

        Raises:
            SandboxError: The started sandbox cannot fork, or the fork failed.
        """
        child = LazySandbox(self._factory, pool=self._pool)
        if self._starting is None:
            return child
        made = await fork_sandbox(await self._get())
        child._stack.push_async_callback(made.close)
        child._starting = asyncio.get_running_loop().create_future()
        child._starting.set_result(made)
        return child

    async def close(self) -> None:
        """Closes (or returns to the pool) the real sandbox if one was started; idempotent."""
        self._closed = True
        starting, self._starting = self._starting, None
        if starting is not None:
            with contextlib.suppress(Exception):  # a failed start leaves only the stack to unwind
                await starting
        err = self._broken
        if err is None:
            await self._stack.aclose()
        else:
            await self._stack.__aexit__(type(err), err, err.__traceback__)

    async def __aenter__(self) -> LazySandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout_s: float | None = None,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        return await self._call(lambda sb: sb.exec(cmd, timeout_s=timeout_s, stdin=stdin, env=env))

    async def run_code(
        self, code: str, *, language: str = "python", timeout_s: float | None = None
    ) -> ExecResult:
        return await self._call(
            lambda sb: sb.run_code(code, language=language, timeout_s=timeout_s)
        )

    async def write_file(self, path: str, data: str | bytes) -> None:
        await self._call(lambda sb: sb.write_file(path, data))

    async def read_file(self, path: str) -> bytes:
        return await self._call(lambda sb: sb.read_file(path))


@contextlib.asynccontextmanager
async def _local_pool(size: int) -> AsyncIterator[dict[str, Any]]:
    # Warmed in the background from the start of the run (while servers boot or attach and
    # the first evaluation runs): a sandbox started mid-training costs its episode ~0.3 s
    # and the rollout side ~40 ms of CPU, which in fully_async delayed the first batches.
    async with SandboxPool(lambda: make_sandbox("local"), size, prestart=0, warm=size) as pool:
        yield {"sandbox_pool": pool}


@register_env("retool")
class RetoolEnv(Env):
    """ReTool-style math with a ``python`` tool.

    Args:
        sandbox_factory: Makes the episode's (unstarted) Sandbox; default: a LocalSandbox.
        sandbox_pool: Lend the episode's sandbox from this pool instead.
        sandbox_pool_size: With neither of the above, a training run lends the local
            sandboxes of its episodes from one pool of this many warm ones (started in the
            background from the start of the run, 4 at a time, then reset between episodes:
            nothing of one reaches the next), which saves starting and stopping one per
            episode (~40 ms of CPU and ~8 MB each); 0: a fresh sandbox per episode. An
            episode that finds all of them lent waits for one.
        format_reward: Added for a well-formed ``\\boxed{}`` answer, right or wrong (0: off).
        system_prompt: Sent first unless the task's prompt has its own system message.
        code_timeout_s: Wall-clock limit of one code run (None: the sandbox's limit).
        worked_examples: Solved exchanges shown before the task (0-3; see
            :func:`worked_example_messages`), for a model that must be taught the tool format.
    """

    name = "retool"
    max_turns = 8
    preset = "preset.yaml"  # `agentrl train --env retool`: SmolLM2-135M on 2 CPU cores

    def __init__(
        self,
        *,
        sandbox_factory: SandboxFactory | None = None,
        sandbox_pool: SandboxPool | None = None,
        sandbox_pool_size: int = 64,
        format_reward: float = 0.0,
        system_prompt: str = SYSTEM_PROMPT,
        code_timeout_s: float | None = 10.0,
        worked_examples: int = 0,
    ) -> None:
        if sandbox_pool_size < 0:
            raise ValueError(f"sandbox_pool_size must be >= 0, got {sandbox_pool_size}")
        self._examples = worked_example_messages(worked_examples)
        self.format_reward = float(format_reward)
        self.system_prompt = system_prompt
        self.code_timeout_s = code_timeout_s
        self._factory = sandbox_factory
        self._pool = sandbox_pool
        self._new_sandbox()
        self.task: RetoolTask | None = None
        self._tool_calls = 0

    def _new_sandbox(self) -> None:
        self.sandbox = LazySandbox(self._factory, pool=self._pool)
        self._python = PythonInterpreter(self.sandbox, timeout_s=self.code_timeout_s)

    @classmethod
    def run_resources(
        cls,
        *,
        sandbox_factory: SandboxFactory | None = None,
        sandbox_pool: SandboxPool | None = None,
        sandbox_pool_size: int = 64,
        **_: Any,
    ) -> contextlib.AbstractAsyncContextManager[dict[str, Any]] | None:
        """The run's pool of warm local sandboxes (see ``sandbox_pool_size``)."""
        if sandbox_factory is not None or sandbox_pool is not None or sandbox_pool_size < 1:
            return None
        return _local_pool(sandbox_pool_size)

    @classmethod
    async def preflight(cls, **kwargs: Any) -> None:
        """Starts one sandbox and runs ``print(2 + 2)`` in it, so a run fails at start-up,
        not in every episode, when sandboxes cannot start here."""
        env = cls(**kwargs)
        try:
            out = await env.sandbox.run_code("print(2 + 2)")
            if out.stdout.strip() != "4":
                raise SandboxError(
                    f"the sandbox ran `print(2 + 2)` but printed {out.stdout!r} "
                    f"(stderr: {out.stderr[-500:]!r}, exit code {out.exit_code})"
                )
        finally:
            await env.close()

    @staticmethod
    def load_tasks(path: str) -> list[dict[str, Any]]:
        """Reads and validates a task file (see :func:`agentrl.envs.retool.data.load_tasks`)."""
        return load_tasks(path)

    @staticmethod
    def default_tasks(
        split: Split | str = Split.TRAIN, n: int = 1024, seed: int = 0, level: str = "standard"
    ) -> list[dict[str, Any]]:
        """Generated tasks (see :func:`agentrl.envs.retool.data.generate_tasks`)."""
        return generate_tasks(n, split=split, seed=seed, level=level)

    @classmethod
    def demonstrations(cls, n: int, *, seed: int = 0, level: str = "tiny") -> list[Demo]:
        """Warm-start demonstrations (see :func:`agentrl.envs.retool.demos.demonstrations`)."""
        from .demos import demonstrations

        return demonstrations(cls(), n, seed=seed, level=level)

    def example_task(self) -> dict[str, Any]:
        """One task, for ``agentrl.testing.check_env``."""
        return generate_tasks(1, seed=0)[0]

    def reset(self, task: Mapping[str, Any], *, seed: int | None = None) -> list[Message]:
        """Validates the task row and returns the system + prompt messages."""
        self.task = parse_task(task, source=f"task {task.get('id', '?')!r}")
        self._tool_calls = 0
        if self.sandbox.closed:  # reused after close(): the next tool call gets a new sandbox
            self._new_sandbox()
        msgs = list(self.task.messages)
        if self._examples:
            at = next((i for i, m in enumerate(msgs) if m.role != "system"), len(msgs))
            msgs[at:at] = self._examples
        if self.system_prompt and not any(m.role == "system" for m in msgs):
            msgs.insert(0, Message.system(self.system_prompt))
        return msgs

    def tools(self) -> Sequence[Any]:
        return (self._python,)

    async def fork(self) -> RetoolEnv:
        """This episode's copy for a tree branch: its own sandbox (see :meth:`LazySandbox.fork`:
        the parent's files, which are the python tool's state) and interpreter bound to it."""
        child = copy.copy(self)
        child.sandbox = await self.sandbox.fork()
        child._python = PythonInterpreter(child.sandbox, timeout_s=self.code_timeout_s)
        return child

    def step(self, action: Action) -> StepResult:
        """Ends on a boxed answer (scored) or on a turn without tool calls (reward 0)."""
        if self.task is None:
            raise RuntimeError("RetoolEnv.step called before reset")
        text = action.content or action.text
        calls = len(action.tool_calls) + len(action.parse_errors)
        self._tool_calls += calls
        info: dict[str, Any] = {"answer": self.task.answer}
        if extract_boxed(text) is not None:
            s = score(text, self.task.answer, format_reward=self.format_reward)
            info.update(reason="answered", pred=s.pred, correct=s.correct)
            return StepResult(
                reward=s.reward, terminated=True, metrics=self._metrics(s.correct, True), info=info
            )
        if calls:
            return StepResult(metrics={"tool_calls_in_turn": float(calls)})
        info.update(reason="no_answer", pred=None, correct=False)
        return StepResult(
            reward=0.0, terminated=True, metrics=self._metrics(False, False), info=info
        )

    def _metrics(self, correct: bool, has_answer: bool) -> dict[str, float]:
        return {
            "correct": float(correct),
            "has_answer": float(has_answer),
            "tool_calls": float(self._tool_calls),
        }

    async def close(self) -> None:
        """Closes the episode's sandbox, if one was started."""
        await self.sandbox.close()
