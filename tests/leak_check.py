"""What a test session of ours left behind: processes, sandbox containers, /dev/shm entries.

Ownership is exact, so a concurrent session's leftovers are never blamed on this one:

- processes: those whose environment carries this session's mark (set before any test
  runs, inherited by every child) or that descend from the session's process, except the
  session itself, its own watchdog (which outlives it by design) and the Docker engine
  (a test may restart it; it is the machine's);
- containers and volumes: those labelled with an owner this session registered through
  :mod:`agentrl.runtime.watchdog` (recorded in the session's ledger);
- /dev/shm: the entries in the ledger (weight directories registered by agentrl, the
  ``psm_*`` segments and ``sem.mp-*`` semaphores the vLLM reaper saw its servers map).
  New ``agentrl-*``/``psm_*``/``sem.mp-*`` entries nobody of ours recorded are listed as
  a note, not a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.runtime.watchdog import LEDGER_ENV

MARK_ENV = "AGENTRL_TEST_SESSION"
_SHM = Path("/dev/shm")
_ENGINE = ("dockerd", "containerd", "docker-proxy", "runc")


def _shm_entries() -> set[str]:
    try:
        prefixes = ("agentrl-", "psm_", "sem.mp-")
        return {str(p) for p in _SHM.iterdir() if p.name.startswith(prefixes)}
    except OSError:
        return set()


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def alive(pid: int) -> bool:
    """``pid`` is a running process: it exists and has not exited (a zombie, exited and
    not yet reaped, e.g. an orphan the machine's init has not waited for, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


@dataclass
class Leaks:
    """What is left, each entry a printable line."""

    processes: dict[int, str] = field(default_factory=dict)
    containers: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    unattributed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.processes or self.containers or self.paths)

    def report(self) -> str:
        lines = [f"process {pid}: {cmd}" for pid, cmd in sorted(self.processes.items())]
        lines += [f"container {c}" for c in self.containers]
        lines += [f"path {p}" for p in self.paths]
        return "\n".join(lines)


class LeakCheck:
    """Marks the session at start; :meth:`find` lists what of it is left."""

    def __init__(self) -> None:
        self.mark = uuid.uuid4().hex
        self.pid = os.getpid()
        fd, self.ledger = tempfile.mkstemp(prefix="agentrl-leak-ledger-", suffix=".txt")
        os.close(fd)
        self.shm_before = _shm_entries()
        os.environ[MARK_ENV] = self.mark
        os.environ[LEDGER_ENV] = self.ledger

    def _ours(self, pid: int) -> bool:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False
        return f"{MARK_ENV}={self.mark}".encode() in env.split(b"\0")

    def _exempt(self, pid: int) -> bool:
        try:  # the Docker engine is the machine's, even when a test (re)started it
            if Path(f"/proc/{pid}/comm").read_text().strip().startswith(_ENGINE):
                return True
        except OSError:
            return True
        cmd = _cmdline(pid)
        own_watchdog = "agentrl.runtime.watchdog" in cmd and cmd[cmd.index("--owner") + 1 :][
            :1
        ] == [str(self.pid)]
        # multiprocessing's resource tracker of the session itself: it reads a pipe from the
        # session and exits when the session does (one whose parent died is still a leak).
        own_tracker = _ppid(pid) == self.pid and any(
            "multiprocessing.resource_tracker" in part for part in cmd
        )
        return pid == self.pid or own_watchdog or own_tracker

    def processes(self) -> dict[int, str]:
        pids = _pids()
        children: dict[int, list[int]] = {}
        for pid in pids:
            children.setdefault(_ppid(pid), []).append(pid)
        tree, todo = set(), [self.pid]
        while todo:
            for c in children.get(todo.pop(), []):
                if c not in tree:
                    tree.add(c)
                    todo.append(c)
        found = {}
        for pid in pids:
            if (pid in tree or self._ours(pid)) and not self._exempt(pid):
                cmd = " ".join(_cmdline(pid)).strip()
                if cmd:  # zombies have no command line: nothing left to release
                    found[pid] = cmd[:200]
        return found

    def _ledger(self) -> list[tuple[str, str]]:
        try:
            lines = Path(self.ledger).read_text().splitlines()
        except OSError:
            return []
        return [(k, v) for k, _, v in (line.partition(" ") for line in lines) if v]

    def _paths(self) -> set[str]:
        """Paths registered and not unregistered since (the last word counts)."""
        live: set[str] = set()
        for k, v in self._ledger():
            if k == "path":
                live.add(v)
            elif k == "unpath":
                live.discard(v)
        return live

    def containers(self) -> list[str]:
        owners = {v for k, v in self._ledger() if k == "docker"}
        if not owners:
            return []
        import docker

        client = docker.from_env(timeout=30)
        found = []
        try:
            for owner in owners:
                filters = {"label": [f"{k}={v}" for k, v in json.loads(owner).items()]}
                found += [
                    f"{c.name} ({c.status}, pid {c.labels.get('agentrl.pid')})"
                    for c in client.containers.list(all=True, filters=filters, ignore_removed=True)
                ]
        finally:
            client.close()
        return found

    def find(self, wait_s: float = 30.0) -> Leaks:
        """What is left, after waiting up to ``wait_s`` for things still shutting down."""
        deadline = time.monotonic() + wait_s
        while True:
            paths = sorted(p for p in self._paths() if os.path.exists(p))
            leaks = Leaks(self.processes(), self.containers(), paths)
            if not leaks or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        known = {v for k, v in self._ledger() if k in ("path", "unpath")}
        leaks.unattributed = sorted(_shm_entries() - self.shm_before - known)
        return leaks

    def clean(self, leaks: Leaks) -> None:
        """Removes what :meth:`find` found (after it was reported)."""
        for pid in leaks.processes:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        from agentrl.runtime.watchdog import remove_docker

        for k, v in self._ledger():
            if k == "docker" and leaks.containers:
                with contextlib.suppress(Exception):
                    remove_docker(json.loads(v))
        for path in leaks.paths:
            with contextlib.suppress(OSError):
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.ledger)
