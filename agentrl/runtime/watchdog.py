"""Cleans up after a process however it ends, SIGKILL and OOM kill included.

A process that creates something outside itself (a weight directory in ``/dev/shm``,
Docker sandbox containers) registers it here. The first registration starts one small
watchdog process for the owner (``python -m agentrl.runtime.watchdog``, in its own session, deaf
to the terminal's SIGINT/SIGHUP) that learns what to clean through a pipe. When the owner
is gone — a normal exit, an exception, a signal, or a SIGKILL the owner never sees — the
watchdog removes the registered paths that still exist and the Docker containers and
volumes labelled with the owner's pid, then exits. An owner that cleans up itself
unregisters the path first, so a normal exit leaves the watchdog nothing to do.

With ``AGENTRL_LEAK_LEDGER`` set (the test suite sets it), every registration is also
appended to that file, so a check at the end can name what a run of ours created and left.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["LEDGER_ENV", "ledger", "proc_start", "unwatch_path", "watch_docker", "watch_path"]

LEDGER_ENV = "AGENTRL_LEAK_LEDGER"
_POLL_S = 0.25
_HAS_PROC = os.path.isdir("/proc/self")


def proc_start(pid: int) -> str:
    """Start time of process ``pid`` (tells a live owner from a reused pid); '' when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[1].split()
    return "" if fields[0] in ("Z", "X") else fields[19]


def ledger(kind: str, value: str) -> None:
    """Appends ``kind value`` to the leak ledger when ``AGENTRL_LEAK_LEDGER`` names one."""
    path = os.environ.get(LEDGER_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "a") as f:
            f.write(f"{kind} {value}\n")


class _Client:
    """The owner's end: one watchdog per process (a forked child starts its own)."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self.docker: set[str] = set()

    def send(self, msg: dict[str, Any]) -> None:
        if not _HAS_PROC:  # no /proc (not Linux): the owner cannot be told from a reused pid
            return
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "agentrl.runtime.watchdog", "--owner", str(self.owner),
                     "--owner-start", proc_start(self.owner)],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                    start_new_session=True, close_fds=True,
                )  # fmt: skip
            assert self._proc.stdin is not None
            with contextlib.suppress(OSError):
                self._proc.stdin.write(json.dumps(msg).encode() + b"\n")
                self._proc.stdin.flush()

    def forget(self) -> None:
        """In a forked child: drop the parent's pipe (the parent's watchdog is not ours)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.stdin is not None:
                with contextlib.suppress(OSError, ValueError):
                    proc.stdin.close()
            proc.returncode = 0  # never wait() on the parent's child


_client: _Client | None = None
_client_lock = threading.Lock()


def _get() -> _Client:
    global _client
    with _client_lock:
        if _client is None or _client.owner != os.getpid():
            _client = _Client()
        return _client


def _after_fork() -> None:
    global _client
    if _client is not None:
        _client.forget()
        _client = None


os.register_at_fork(after_in_child=_after_fork)


def watch_path(path: str | os.PathLike[str]) -> None:
    """Removes ``path`` (file or directory tree) when this process dies, unless unwatched."""
    p = os.path.abspath(path)
    ledger("path", p)
    _get().send({"path": p})


def unwatch_path(path: str | os.PathLike[str]) -> None:
    """Forgets ``path`` (its owner removed it, or keeps it on purpose)."""
    p = os.path.abspath(path)
    ledger("unpath", p)
    if _client is not None and _client.owner == os.getpid():
        _client.send({"unpath": p})


def watch_docker(labels: dict[str, str]) -> None:
    """Removes containers and volumes carrying all of ``labels`` when this process dies.

    ``labels`` must name this process (e.g. ``agentrl.pid`` and ``agentrl.pid_start``),
    so that another run's containers are never matched.
    """
    key = json.dumps(labels, sort_keys=True)
    client = _get()
    if key not in client.docker:
        client.docker.add(key)
        ledger("docker", key)
        client.send({"docker": labels})


# ------------------------------------------------------------------ the watchdog itself
def _remove_path(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def remove_docker(labels: dict[str, str], timeout_s: float = 60.0) -> int:
    """Removes containers (then volumes) carrying all of ``labels``; how many containers."""
    import docker

    filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
    client = docker.from_env(timeout=int(timeout_s))
    n = 0
    try:
        # ignore_removed: one removed meanwhile (by its owner) is skipped, not an error.
        for c in client.containers.list(all=True, filters=filters, ignore_removed=True):
            with contextlib.suppress(Exception):
                c.remove(force=True, v=True)
                n += 1
        for v in client.volumes.list(filters=filters):
            with contextlib.suppress(Exception):
                v.remove(force=True)
    finally:
        client.close()
    return n


def _clean(paths: set[str], dockers: list[dict[str, str]]) -> None:
    for p in sorted(paths):
        _remove_path(p)
    for labels in dockers:
        if labels.get("agentrl.host", socket.gethostname()) == socket.gethostname():
            with contextlib.suppress(Exception):
                remove_docker(labels)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the watchdog process; see the module docstring."""
    ap = argparse.ArgumentParser(prog="agentrl.runtime.watchdog")
    ap.add_argument("--owner", type=int, required=True, help="pid to watch")
    ap.add_argument("--owner-start", default="", help="its start time (/proc/PID/stat)")
    args = ap.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # the owner decides; its death is our signal
    term = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal term
        term = True

    signal.signal(signal.SIGTERM, on_term)
    start = args.owner_start
    if not start:  # an owner we cannot identify is never cleaned up after
        return 0

    def owner_alive() -> bool:
        return bool(start) and proc_start(args.owner) == start

    paths: set[str] = set()
    dockers: list[dict[str, str]] = []
    buf = b""

    def take(chunk: bytes) -> None:
        nonlocal buf
        *lines, buf = (buf + chunk).split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError, TypeError):
                msg = json.loads(line)
                if "path" in msg:
                    paths.add(msg["path"])
                elif "unpath" in msg:
                    paths.discard(msg["unpath"])
                elif "docker" in msg and msg["docker"] not in dockers:
                    dockers.append(msg["docker"])

    fd: int | None = sys.stdin.fileno()
    term_deadline = 0.0
    while owner_alive():
        if term:  # told to go: give the owner a moment to end too, else leave it alone
            term_deadline = term_deadline or time.monotonic() + 10.0
            if time.monotonic() > term_deadline:
                return 0
        if fd is None:
            time.sleep(_POLL_S)
            continue
        with contextlib.suppress(InterruptedError):
            if select.select([fd], [], [], _POLL_S)[0]:
                chunk = os.read(fd, 65536)
                if chunk:
                    take(chunk)
                else:
                    fd = None  # the owner closed its end: it is exiting
    while fd is not None and select.select([fd], [], [], 0)[0]:  # what it said last
        chunk = os.read(fd, 65536)
        fd = fd if chunk else None
        take(chunk)
    _clean(paths, dockers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
