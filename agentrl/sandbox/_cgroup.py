"""Best-effort per-sandbox cgroups (v1 or v2) for a process-count and a total-memory limit."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field

__all__ = ["SandboxCgroups"]

_LIMIT_FILES = {
    # controller: (v1 file, v2 file)
    "pids": ("pids.max", "pids.max"),
    "memory": ("memory.limit_in_bytes", "memory.max"),
}


def _own_paths() -> dict[str, str]:
    """Maps controller name (or "" for the v2 unified tree) to this process's cgroup path."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _mounts() -> tuple[dict[str, str], str | None]:
    """Returns (v1 controller -> mountpoint, v2 mountpoint) from /proc/self/mountinfo."""
    v1: dict[str, str] = {}
    v2: str | None = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            mountpoint = left.split()[4]
            fstype, _, options = right.split()[:3]
            if fstype == "cgroup2" and v2 is None:
                v2 = mountpoint
            elif fstype == "cgroup":
                for opt in options.split(","):
                    if opt in _LIMIT_FILES:
                        v1.setdefault(opt, mountpoint)
    return v1, v2


@dataclass
class SandboxCgroups:
    """The cgroup directories one sandbox's helper joins; empty where none could be made."""

    dirs: list[str] = field(default_factory=list)
    controllers: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, name: str, *, pids_max: int, memory_bytes: int) -> SandboxCgroups:
        """Creates child cgroups with the limits; skips any controller that is not writable."""
        out = cls()
        try:
            own = _own_paths()
            v1, v2 = _mounts()
        except OSError:
            return out
        limits = {"pids": str(pids_max), "memory": str(memory_bytes)}
        for ctrl, value in limits.items():
            if ctrl in v1:
                base, limit_file = v1[ctrl] + own.get(ctrl, "/"), _LIMIT_FILES[ctrl][0]
            elif v2 is not None and "" in own:
                base, limit_file = v2 + own[""], _LIMIT_FILES[ctrl][1]
                with contextlib.suppress(OSError), open(base + "/cgroup.subtree_control") as f:
                    if ctrl not in f.read().split():
                        continue
            else:
                continue
            path = os.path.join(base.rstrip("/") or "/", f"agentrl-{name}")
            if path in out.dirs:  # v2: one directory serves both controllers
                with contextlib.suppress(OSError), open(f"{path}/{limit_file}", "w") as f:
                    f.write(value)
                    out.controllers.append(ctrl)
                continue
            try:
                os.mkdir(path)
            except OSError:
                continue
            try:
                with open(f"{path}/{limit_file}", "w") as f:
                    f.write(value)
            except OSError:
                os.rmdir(path)
                continue
            out.dirs.append(path)
            out.controllers.append(ctrl)
        return out

    def remove(self, wait_s: float = 2.0) -> None:
        """Removes the directories once their processes are gone (best effort)."""
        deadline = time.monotonic() + wait_s
        for path in self.dirs:
            while True:
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
        self.dirs = []
