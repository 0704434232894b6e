"""Shared by the LocalSandbox tests: its limits, whether namespaces work here, host health."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import subprocess
from pathlib import Path

from agentrl.sandbox import LocalSandbox, SandboxLimits


@functools.cache
def namespaces_work() -> bool:
    """Root, util-linux ``unshare`` and every namespace LocalSandbox uses (probed once)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "true"]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


LIMITS = SandboxLimits(
    wall_timeout_s=3.0,
    cpu_time_s=3,
    memory_mb=256,
    max_processes=16,
    max_file_size_mb=2,
    max_disk_mb=8,
    max_output_bytes=4096,
)


def procs_of_uid(uid: int) -> list[int]:
    """Host pids whose real uid is ``uid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:") and int(line.split()[1]) == uid:
                pids.append(int(entry))
    return pids


def host_can_fork() -> bool:
    return subprocess.run(["true"], timeout=10).returncode == 0


async def assert_host_healthy(sb: LocalSandbox) -> None:
    """The host can fork, nothing of the sandbox's uid survives, and the sandbox still works."""
    assert host_can_fork()
    for _ in range(50):
        if not procs_of_uid(sb.uid):
            break
        await asyncio.sleep(0.02)
    assert procs_of_uid(sb.uid) == []
    r = await sb.exec("echo alive")
    assert r.ok and r.stdout == "alive\n", r
