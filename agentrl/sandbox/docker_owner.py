"""Who owns a sandbox container: labels naming the creating process, and the reaper that
removes containers (and volumes) whose owner on this host is gone."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from pathlib import Path
from typing import Any

__all__ = ["LABEL", "RUN_ID", "owner_labels", "reap_orphans"]

LABEL = "agentrl.sandbox"
RUN_ID = uuid.uuid4().hex[:12]  # this process's run, on every container it creates


def _proc_start(pid: int) -> str:
    """The start time of process ``pid`` (to tell a live owner from a reused pid), or ''."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def owner_labels(run_id: str = RUN_ID) -> dict[str, str]:
    """Labels naming this process as the owner of a container or volume."""
    pid = os.getpid()
    return {
        LABEL: "1",
        "agentrl.run": run_id,
        "agentrl.host": socket.gethostname(),
        "agentrl.pid": str(pid),
        "agentrl.pid_start": _proc_start(pid),
    }


def _owner_gone(labels: dict[str, str]) -> bool:
    if labels.get("agentrl.host") != socket.gethostname():
        return False  # another machine's engine user: not ours to judge
    try:
        pid = int(labels.get("agentrl.pid", ""))
    except ValueError:
        return True
    start = _proc_start(pid)
    return not start or start != labels.get("agentrl.pid_start")


def reap_orphans(client: Any = None) -> int:
    """Removes sandbox containers and volumes whose owning process (on this host) is gone.

    Returns:
        How many containers were removed.
    """
    from agentrl.sandbox.images import docker_client

    client = client or docker_client()
    n = 0
    # ignore_removed: a container another process removes between the list and its
    # inspection is skipped, not an error (two runs on one engine reap at once).
    for c in client.containers.list(all=True, filters={"label": f"{LABEL}=1"}, ignore_removed=True):
        if _owner_gone(c.labels):
            with contextlib.suppress(Exception):
                c.remove(force=True, v=True)
                n += 1
    for v in client.volumes.list(filters={"label": f"{LABEL}=1"}):
        if _owner_gone(v.attrs.get("Labels") or {}):
            with contextlib.suppress(Exception):
                v.remove(force=True)
    return n
