"""The Sandbox protocol: an isolated place to run model-written code."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Protocol, Self, runtime_checkable

__all__ = [
    "LANGUAGES",
    "WORKDIR",
    "ExecResult",
    "ForkableSandbox",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "code_argv",
    "fork_sandbox",
    "workdir_path",
]


#: language -> argv prefix; the code is passed as the last argument. Add entries to extend.
LANGUAGES: dict[str, list[str]] = {
    "python": ["python3", "-c"],
    "bash": ["bash", "-c"],
    "sh": ["sh", "-c"],
}


def code_argv(language: str, code: str) -> list[str]:
    """The argv that runs ``code`` in ``language`` (see :data:`LANGUAGES`)."""
    if language not in LANGUAGES:
        raise ValueError(f"unknown language {language!r}; known: {sorted(LANGUAGES)}")
    return [*LANGUAGES[language], code]


#: The working directory of every sandbox; file paths are relative to it.
WORKDIR = "/workspace"


def workdir_path(path: str) -> str:
    """``path`` (relative to :data:`WORKDIR`, or absolute) normalised, if it stays under it.

    Raises:
        ValueError: the path leaves the working directory, or holds a NUL byte.
    """
    norm = posixpath.normpath(posixpath.join(WORKDIR, str(path)))
    if "\0" in str(path) or not (norm == WORKDIR or norm.startswith(WORKDIR + "/")):
        raise ValueError(f"path {path!r} is outside the sandbox working directory {WORKDIR}")
    return norm


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, died), as opposed to the code in it."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandbox; every call is bounded by default.

    Attributes:
        wall_timeout_s: Wall-clock limit of one exec; the whole process tree is killed after it.
        cpu_time_s: CPU seconds one exec may use (RLIMIT_CPU).
        memory_mb: Address-space limit per process, in MiB.
        max_processes: Most processes/threads alive at once inside the sandbox.
        max_file_size_mb: Largest file the code may write, in MiB.
        max_disk_mb: Most bytes the working directory may hold, in MiB.
        max_output_bytes: stdout/stderr beyond this many bytes are cut.
        network: Whether the code may open network connections.
    """

    wall_timeout_s: float = 10.0
    cpu_time_s: int = 10
    memory_mb: int = 1024
    max_processes: int = 64
    max_file_size_mb: int = 64
    max_disk_mb: int = 256
    max_output_bytes: int = 1 << 20
    network: bool = False


@dataclass(frozen=True)
class ExecResult:
    """Result of one command.

    Attributes:
        stdout: Captured standard output (decoded, possibly cut).
        stderr: Captured standard error (decoded, possibly cut).
        exit_code: The process's exit status (negative: killed by that signal).
        timed_out: The wall-clock limit killed it.
        duration_s: Wall time of the call.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@runtime_checkable
class Sandbox(Protocol):
    """An isolated working directory plus a way to run processes in it.

    Use it as ``async with sandbox:``; ``close()`` is idempotent.
    """

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout_s: float | None = None,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Runs a command (a shell string or an argv list) in the working directory."""
        ...

    async def run_code(
        self, code: str, *, language: str = "python", timeout_s: float | None = None
    ) -> ExecResult:
        """Runs a snippet of code in the given language."""
        ...

    async def write_file(self, path: str, data: str | bytes) -> None:
        """Writes a file; ``path`` is relative to the working directory and must stay inside it."""
        ...

    async def read_file(self, path: str) -> bytes:
        """Reads a file from inside the working directory."""
        ...


@runtime_checkable
class ForkableSandbox(Sandbox, Protocol):
    """A Sandbox that can fork: the extension a tree rollout needs of its env's sandbox.

    ``fork()`` is not a member of :class:`Sandbox` itself, so every existing sandbox (and
    test double) still satisfies that protocol; callers fork through :func:`fork_sandbox`,
    which refuses, naming the class, for a sandbox without it.
    """

    async def fork(self) -> Sandbox:
        """A new, started sandbox whose files are a copy of this one's now.

        The two diverge from then on: writes in either are not seen by the other. No
        process survives a call, so there is none to copy. The caller owns the child and
        closes it (``async with``); closing one leaves the other running.
        """
        ...


async def fork_sandbox(sandbox: Sandbox) -> Sandbox:
    """``await sandbox.fork()`` where the sandbox can fork.

    Raises:
        SandboxError: The sandbox's class defines no ``fork()`` (the message names it),
            or the fork failed (nothing of the child is left running).
    """
    if not isinstance(sandbox, ForkableSandbox):
        raise SandboxError(
            f"{type(sandbox).__qualname__} cannot fork: it defines no fork() (tree rollouts "
            "branch an episode's sandbox; LocalSandbox can fork)"
        )
    return await sandbox.fork()
