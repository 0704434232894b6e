"""Runs a command and takes its whole process tree down with it.

``python -m agentrl.inference.reaper --parent PID -- CMD ...`` is how agentrl
starts a vLLM server: the reaper leads a new process group holding the server and
every process it spawns (API server, engine core, workers). When the parent
process dies (even by SIGKILL), when the reaper gets SIGTERM/SIGINT, or when the
command exits, the reaper sends SIGTERM to the group, waits a grace period, then
SIGKILLs whatever is left. Its exit status is the command's.

While the group runs, the reaper notes the Python shared-memory segments (``psm_*`` in
``/dev/shm``: vLLM's message queues) and multiprocessing semaphores (``sem.mp-*``: vLLM's
workers make them in a spawn context, and only its resource tracker, killed with the
group, would unlink them) its members map or hold open; those still there once the group
is dead (a member SIGKILLed before it could unlink them) are removed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType

from agentrl.runtime.watchdog import ledger

__all__ = ["group_members", "kill_members", "main", "shm_in_use"]

_PR_SET_PDEATHSIG = 1
_SHM = "/dev/shm/"
_SHM_SCAN_S = 2.0


def _set_parent_death_signal(sig: int) -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except OSError:  # not Linux: the parent poll below still catches it
        pass


def group_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` other than this process."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                if os.getpgid(int(name)) == pgid:
                    out.append(int(name))
            except (ProcessLookupError, PermissionError):
                continue
    return out


def kill_members(pgid: int) -> None:
    """SIGKILLs every process of group ``pgid`` but its leader (a crash the reaper outlives)."""
    for pid in group_members(pgid):
        if pid != pgid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def shm_in_use(pids: list[int]) -> set[str]:
    """The ``/dev/shm`` entries the processes ``pids`` map or hold open.

    Matched by inode, not by the name in ``/proc/PID/maps``: glibc makes a POSIX semaphore
    under a temporary name, maps it, then links it to its own name (``sem.mp-*``) and
    removes the temporary one, so its maker's mapping reads ``sem.XXXXXX (deleted)``.
    """
    inodes: set[int] = set()
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as f:
            for line in f:
                if _SHM in line:  # address perms offset dev inode path
                    inodes.add(int(line.split()[4]))
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(_SHM):
                        inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
    if not inodes:
        return set()
    with contextlib.suppress(OSError), os.scandir(_SHM) as entries:
        return {e.path for e in entries if e.is_file(follow_symlinks=False) and e.inode() in inodes}
    return set()


def _group_owned(path: str) -> bool:
    """Python shared memory (``psm_*``, vLLM's message queues) and multiprocessing
    semaphores (``sem.mp-*``; only processes the creator spawned open them): made by the
    group itself. Others (NCCL's, a trainer's) may belong to a process outside it and are
    left alone."""
    return os.path.basename(path).startswith(("psm_", "sem.mp-"))


class _ShmTracker:
    """Remembers the group's /dev/shm entries, to remove those left once it is dead."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.seen: set[str] = set()
        self._next = 0.0

    def scan(self, force: bool = False) -> None:
        if not force and time.monotonic() < self._next:
            return
        self._next = time.monotonic() + _SHM_SCAN_S
        mapped = shm_in_use(group_members(self.pgid))
        for path in {p for p in mapped if _group_owned(p)} - self.seen:
            self.seen.add(path)
            ledger("path", path)

    def remove_left(self) -> None:
        for path in self.seen:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _kill_group(grace_s: float, child: subprocess.Popen[bytes]) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pgid = os.getpgid(0)
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        child.poll()
        if not group_members(pgid):
            return
        time.sleep(0.1)
    for pid in group_members(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    child.poll()


def _parse_cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    ap = argparse.ArgumentParser(prog="agentrl.inference.reaper")
    ap.add_argument("--parent", type=int, required=True, help="pid to watch")
    ap.add_argument("--grace", type=float, default=10.0, help="seconds between TERM and KILL")
    ap.add_argument("--cpus", default="", help="pin the command to these CPUs (e.g. 0-1,3)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given")
    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)
    _set_parent_death_signal(signal.SIGTERM)
    stop = False

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.cpus:  # inherited by the command and everything it starts
        os.sched_setaffinity(0, _parse_cpus(args.cpus))
    child = subprocess.Popen(cmd)
    shm = _ShmTracker(os.getpgid(0))
    while not stop and child.poll() is None:
        if os.getppid() != args.parent:
            break
        shm.scan()
        time.sleep(0.2)
    shm.scan(force=True)
    _kill_group(args.grace, child)
    shm.remove_left()
    code = child.poll()
    return code if code is not None and code >= 0 else 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main())
