"""DockerSandbox's byte plumbing: docker's framed exec streams, exit statuses, output
decoding, upload tars and removals that retry while the engine restarts."""

from __future__ import annotations

import contextlib
import io
import logging
import posixpath
import select
import socket
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentrl.sandbox.docker_scripts import UID

__all__ = ["docker_frames", "finish", "pump", "remove_retrying", "tar_upload", "text"]

log = logging.getLogger(__name__)


def _add(tf: tarfile.TarFile, entries: list[tuple[str, bytes | None]]) -> None:
    """Adds (name, data) pairs owned by uid 1000; data None is a directory."""
    for name, data in entries:
        info = tarfile.TarInfo(name)
        info.uid = info.gid = UID
        info.mtime = int(time.time())
        if data is None:
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(info)
        else:
            info.size, info.mode = len(data), 0o644
            tf.addfile(info, io.BytesIO(data))


def tar_upload(src: Path, rel: str, into: bool) -> bytes:
    """A tar that puts host file/directory ``src`` at ``rel`` (see ``DockerSandbox.upload``)."""
    if not src.exists():
        raise FileNotFoundError(src)
    if src.is_file() and into:
        rel = posixpath.normpath(posixpath.join(rel, src.name))
    parts = [] if rel == "." else rel.split("/")
    parts = parts[:-1] if src.is_file() else parts

    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = UID
        info.uname = info.gname = ""
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        _add(tf, [("/".join(parts[:i]), None) for i in range(1, len(parts) + 1)])
        if src.is_file():
            tf.add(src, arcname=rel, filter=owned)
        else:
            for child in sorted(src.iterdir()):
                arc = posixpath.join(rel, child.name) if rel != "." else child.name
                tf.add(child, arcname=arc, filter=owned)
    return buf.getvalue()


def finish(
    bufs: dict[int, bytearray], dropped: dict[int, int], code: int, t: float, t0: float
) -> tuple[bytearray, bytearray, dict[int, int], int, bool, float]:
    """The wrapper's exit status as ``_exec_raw`` returns it: -N for killed by signal N."""
    elapsed = time.perf_counter() - t0
    timed_out = code == 137 and elapsed >= t - 0.05
    if timed_out:
        code = -9
    elif 128 < code <= 128 + 64:
        code = -(code - 128)  # the shell's convention for "killed by signal N"
    return bufs[1], bufs[2], dropped, code, timed_out, elapsed


def text(buf: bytearray, dropped: int) -> str:
    text = buf.decode("utf-8", errors="replace")
    return text + (f"\n[... output truncated: {dropped} more bytes]" if dropped else "")


def docker_frames(pending: bytearray) -> Iterator[tuple[int, bytes]]:
    """Takes the whole frames of docker's multiplexed exec stream (8-byte header: stream,
    3 zero bytes, big-endian size) off the front of ``pending``: (stream, payload) each;
    a partial frame stays for the next chunk."""
    while len(pending) >= 8:
        size = int.from_bytes(pending[4:8], "big")
        if len(pending) < 8 + size:
            return
        stream, data = pending[0], bytes(pending[8 : 8 + size])
        del pending[: 8 + size]
        yield stream, data


def pump(
    raw: Any,
    stdin: bytes,
    deadline: float,
    bufs: dict[int, bytearray],
    dropped: dict[int, int],
    cap: int,
) -> bool:
    """Feeds stdin and demultiplexes docker's framed output until EOF (True) or the deadline."""
    pending = bytearray()
    stdin_open = True
    poll = select.poll()
    poll.register(raw, select.POLLIN | select.POLLOUT)
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return False
        for _, ev in poll.poll(left * 1000):
            if stdin_open and ev & select.POLLOUT:
                if stdin:
                    n = raw.send(stdin[: 1 << 16])
                    stdin = stdin[n:]
                if not stdin:
                    with contextlib.suppress(OSError):
                        raw.shutdown(socket.SHUT_WR)
                    stdin_open = False
                    poll.modify(raw, select.POLLIN)
            if ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                chunk = raw.recv(1 << 16)
                if not chunk:
                    return True
                pending += chunk
                for stream, data in docker_frames(pending):
                    buf = bufs.get(stream, bufs[1])
                    room = max(0, cap - len(buf))
                    buf += data[:room]
                    dropped[stream if stream in dropped else 1] += len(data) - min(room, len(data))


def remove_retrying(remove: Callable[[], Any], deadline: float) -> None:
    """Calls ``remove`` until it works, the object is gone, or ``deadline`` passes.

    A failed removal (the engine restarting, a stale pooled connection) is retried
    with backoff instead of leaving the container behind for the rest of the run; if
    the engine never answers, the owner's watchdog removes it when the run ends.
    """
    import docker.errors

    delay = 0.2
    while True:
        try:
            remove()
            return
        except docker.errors.NotFound:
            return
        except Exception as e:
            if time.monotonic() + delay > deadline:
                log.warning("could not remove a sandbox container/volume: %r", e)
                return
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
