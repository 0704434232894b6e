"""A small real filesystem for full-disk tests (checkpoints, resumes)."""

from __future__ import annotations

import contextlib
import resource
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def small_disk(
    path: Path, size: int
) -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """A real filesystem of ``size`` bytes at ``path`` (tmpfs). Where mounting is not
    permitted: a plain directory and a function ``fill`` that sets RLIMIT_FSIZE to
    16 KiB (call it once the first checkpoint is written). ``grow`` frees the disk
    (remounts bigger / lifts the limit). Yields (kind, fill, grow)."""
    path.mkdir(parents=True)
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", f"agentrl-test-{uuid.uuid4().hex[:6]}",
             str(path)],
            capture_output=True,
        ).returncode == 0  # fmt: skip
    except OSError:  # no mount command
        mounted = False
    if mounted:

        def grow_fs() -> None:
            subprocess.run(["mount", "-o", "remount,size=64m", str(path)], check=True)

        try:
            yield "tmpfs", lambda: None, grow_fs
        finally:
            subprocess.run(["umount", "-l", str(path)], check=False)
        return
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill

    def fill() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, old[1]))

    def grow() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)

    try:
        yield "rlimit", fill, grow
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, old_handler)
