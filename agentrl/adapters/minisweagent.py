"""mini-swe-agent's Environment over an agentrl Sandbox: its agent runs its commands there.

`mini-swe-agent <https://mini-swe-agent.com>`_ (``pip install 'agentrl[swe-agents]'``) is
synchronous: its ``DefaultAgent`` calls ``env.execute(action)`` from the thread it runs in.
:class:`AgentrlSandboxEnvironment` implements mini-swe-agent's Environment protocol
(``execute``, ``get_template_vars``, ``serialize``) by handing each command to an agentrl
sandbox (``LocalSandbox``, ``DockerSandbox``) on the event loop that owns it, and waiting
for it with a finite timeout. It answers as mini-swe-agent's own environments do: a dict
with ``output`` (stdout and stderr together), ``returncode`` and ``exception_info``, and the
submit line (``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` as the first line of a command's
output) raises mini-swe-agent's ``Submitted``. Every command is kept in ``commands``.

Example (the agent in a worker thread, the sandbox on the running loop)::

    env = AgentrlSandboxEnvironment(sandbox, loop=asyncio.get_running_loop(), cwd="/workspace")
    agent = DefaultAgent(model, env, **config["agent"])
    result = await asyncio.to_thread(agent.run, "Fix the failing test")
    env.close()

``agentrl.envs.swe.minisweagent`` runs mini-swe-agent on the SWE env's tasks with it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import importlib.util
import os
import platform
import shlex
import threading
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from agentrl.errors import UserError
from agentrl.sandbox.base import Sandbox, SandboxError

__all__ = [
    "INSTALL_HINT",
    "SUBMIT_LINE",
    "AgentrlSandboxEnvironment",
    "CommandRecord",
    "MiniSweAgentMissingError",
    "SandboxEnvironmentConfig",
    "SandboxEnvironmentError",
    "minisweagent_module",
    "require_minisweagent",
]

INSTALL_HINT = "pip install 'agentrl[swe-agents]'"
SUBMIT_LINE = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_GRACE_S = 30.0  # waited beyond a command's own timeout (the sandbox's reply, a busy loop)


class MiniSweAgentMissingError(UserError, ImportError):
    """mini-swe-agent is not installed; the message says how to install it."""

    def __init__(self) -> None:
        super().__init__(f"mini-swe-agent is not installed: {INSTALL_HINT}")


def require_minisweagent() -> None:
    """Raises :class:`MiniSweAgentMissingError` unless mini-swe-agent can be imported
    (without importing it)."""
    try:
        found = importlib.util.find_spec("minisweagent") is not None
    except (ImportError, ValueError):  # a broken install or a stub in sys.modules
        found = False
    if not found:
        raise MiniSweAgentMissingError()


def minisweagent_module(name: str = "minisweagent") -> ModuleType:
    """Imports ``name`` from mini-swe-agent, without its start-up banner and without
    litellm downloading its cost map.

    Raises:
        MiniSweAgentMissingError: mini-swe-agent is not installed.
    """
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in ("minisweagent", "litellm"):
            raise
        raise MiniSweAgentMissingError() from e


class SandboxEnvironmentError(RuntimeError):
    """The environment cannot run a command: it was closed, or was called on its loop's thread."""


class SandboxEnvironmentConfig(BaseModel):
    """Settings of :class:`AgentrlSandboxEnvironment` (mini-swe-agent reads them as template
    variables, like its ``LocalEnvironmentConfig``)."""

    cwd: str = ""
    """Directory commands start in ("" : the sandbox's working directory)."""
    env: dict[str, str] = {}
    """Environment variables of every command."""
    timeout: float = 30.0
    """Default wall-clock limit of one command, in seconds."""
    max_timeout: float = 600.0
    """A command's ``timeout`` argument is capped at this."""


@dataclass(frozen=True)
class CommandRecord:
    """One command the agent ran."""

    command: str
    returncode: int
    timed_out: bool
    duration_s: float


class AgentrlSandboxEnvironment:
    """mini-swe-agent's Environment protocol over an agentrl :class:`~agentrl.sandbox.base.Sandbox`.

    Args:
        sandbox: A started sandbox; it stays the caller's to close.
        loop: The event loop that owns ``sandbox``; ``execute`` must be called from
            another thread (mini-swe-agent's agents are sync: run them in a thread).
        **kwargs: :class:`SandboxEnvironmentConfig` fields (``cwd``, ``env``, ``timeout``,
            ``max_timeout``); mini-swe-agent's ``environment`` config section fits.
    """

    def __init__(self, sandbox: Sandbox, *, loop: asyncio.AbstractEventLoop, **kwargs: Any) -> None:
        known = SandboxEnvironmentConfig.model_fields
        self.config = SandboxEnvironmentConfig(**{k: v for k, v in kwargs.items() if k in known})
        if self.config.timeout <= 0 or self.config.max_timeout <= 0:
            raise ValueError("timeout and max_timeout must be positive")
        self.sandbox = sandbox
        self.loop = loop
        self.commands: list[CommandRecord] = []
        self._closed = threading.Event()
        self._inflight: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the protocol
    def execute(
        self, action: dict[str, Any], cwd: str = "", *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Runs ``action["command"]`` with bash in the sandbox; mini-swe-agent's output dict.

        Raises:
            Submitted: The output's first line is the submit line and the command exited 0.
            SandboxEnvironmentError: The environment is closed or called on its loop's thread.
        """
        command = str(action.get("command", ""))
        limit = min(float(timeout or self.config.timeout), self.config.max_timeout)
        where = cwd or self.config.cwd
        script = f"cd {shlex.quote(where)} || exit 1\n" if where else ""
        argv = ["bash", "-c", f"{script}exec 2>&1\n{command}"]
        t0 = time.perf_counter()
        try:
            res = self._call(
                self.sandbox.exec(argv, timeout_s=limit, env=self.config.env or None),
                limit + _GRACE_S,
            )
        except (SandboxError, TimeoutError, OSError, ValueError) as e:
            self.commands.append(CommandRecord(command, -1, False, time.perf_counter() - t0))
            return {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {e}",
                "extra": {"exception_type": type(e).__name__, "exception": str(e)},
            }
        output = res.stdout + res.stderr
        self.commands.append(CommandRecord(command, res.exit_code, res.timed_out, res.duration_s))
        if res.timed_out:
            return {
                "output": output,
                "returncode": -1,
                "exception_info": f"The command timed out after {limit:g} seconds and was killed.",
                "extra": {"exception_type": "TimeoutExpired"},
            }
        result = {"output": output, "returncode": res.exit_code, "exception_info": ""}
        self._check_finished(result)
        return result

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config and ``platform.uname()`` fields (``system``, ``release``, ``version``,
        ``machine``: mini-swe-agent's prompts use them), then ``kwargs``."""
        return {**self.config.model_dump(), **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict[str, Any]:
        """The environment's part of mini-swe-agent's trajectory file."""
        cls = type(self)
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{cls.__module__}.{cls.__name__}",
                }
            }
        }

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Refuses later commands and cancels the one in flight (idempotent; any thread)."""
        self._closed.set()
        with self._lock:
            inflight = list(self._inflight)
        for fut in inflight:
            fut.cancel()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    # ------------------------------------------------------------------ helpers
    def _call(self, coro: Any, timeout: float) -> Any:
        """Runs ``coro`` on the sandbox's loop and waits up to ``timeout`` s for its result."""
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if on_loop or self._closed.is_set():
            coro.close()
            raise SandboxEnvironmentError(
                "the environment is closed"
                if self._closed.is_set()
                else "execute() was called on the sandbox's event loop thread, where it would "
                "wait forever: run the mini-swe-agent agent in a worker thread "
                "(asyncio.to_thread(agent.run, task))"
            )
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        with self._lock:
            self._inflight.add(fut)
        try:
            return fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError as e:
            fut.cancel()
            raise TimeoutError(f"the sandbox did not answer within {timeout:g}s") from e
        except concurrent.futures.CancelledError as e:
            raise SandboxEnvironmentError("the environment is closed") from e
        finally:
            with self._lock:
                self._inflight.discard(fut)

    def _check_finished(self, output: dict[str, Any]) -> None:
        """Raises mini-swe-agent's ``Submitted`` when the output starts with the submit line."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_LINE and output["returncode"] == 0:
            submission = "".join(lines[1:])
            minisweagent_module()
            from minisweagent.exceptions import Submitted

            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )
