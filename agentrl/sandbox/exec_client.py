"""Host end of a sandbox's resident exec server (:mod:`agentrl.sandbox.exec_server`).

:class:`ResidentExec` holds one attached ``docker exec -i`` stream to the server in one
container and runs commands over it, one at a time (a caller that finds it busy uses a
plain ``docker exec``). It never runs a command twice: a server found dead before a
request is sent is restarted; one that dies after is reported as the command killed.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.sandbox import docker_scripts as scripts
from agentrl.sandbox.docker_io import docker_frames

_U32 = struct.Struct(">I")
_SOURCE = Path(__file__).with_name("exec_server.py").read_text()
_START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ExecRequest:
    """One command as the exec wrapper runs it (by either path).

    Attributes:
        argv: The command.
        t: Its timeout, seconds (the wrapper's ``timeout -s KILL``).
        stdin: Bytes for its stdin (None: none).
        env: More environment variables (None: none).
        cap: Bytes kept of each of stdout and stderr (the rest is counted).
        kill_background: Sweep the processes it leaves behind.
    """

    argv: list[str]
    t: float
    stdin: bytes | None = None
    env: dict[str, str] | None = None
    cap: int = 1 << 20
    kill_background: bool = True


class ServerUnavailable(Exception):
    """The server could not take this request; nothing ran: use ``docker exec`` instead."""


class Raw:
    """What one command did: (stdout, stderr, bytes dropped per stream, exit status)."""

    def __init__(self) -> None:
        self.bufs: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        self.dropped = {1: 0, 2: 0}
        self.code: int | None = None  # None: the server died before reporting it


def _recv(raw: Any, timeout: float) -> bytes | None:
    """What the stream has within ``timeout`` seconds: None if nothing came, b"" at its end."""
    if not select.select([raw], [], [], timeout)[0]:
        return None
    try:
        return bytes(raw.recv(1 << 16))
    except OSError:
        return b""


class ResidentExec:
    """One container's exec server, started on first use.

    Args:
        api: The docker SDK's low-level ``APIClient``.
        container_id: The container to run in.
        user: ``uid:gid`` the server (and so every command) runs as.
        workdir: The server's (and the commands') working directory.
        grace_s: How long a command may take to end once killed past its deadline.
    """

    def __init__(
        self, api: Any, container_id: str, user: str, workdir: str, grace_s: float = 5.0
    ) -> None:
        self._api = api
        self.grace_s = grace_s
        self._container = container_id
        self._user = user
        self._workdir = workdir
        self._sock: Any = None  # the docker.sock connection, kept alive with the stream
        self._raw: socket.socket | None = None
        self._pending = bytearray()  # docker-framed bytes not parsed yet
        self._out = bytearray()  # the server's stdout, not parsed into frames yet
        self.lock = threading.Lock()
        self.unavailable = ""  # why the image cannot run the server (then: never again)
        self.stderr_tail = ""  # the server's stderr, e.g. ``python3: not found``
        self.starts = 0

    # ---------------------------------------------------------------- lifecycle
    def _start(self) -> None:
        ex = self._api.exec_create(
            self._container, ["python3", "-c", _SOURCE, scripts.WRAPPER], stdin=True,
            user=self._user, workdir=self._workdir,
        )  # fmt: skip
        self._sock = self._api.exec_start(ex["Id"], socket=True)
        self._raw = getattr(self._sock, "_sock", self._sock)
        self._pending.clear()
        self._out.clear()
        self.starts += 1
        deadline = time.perf_counter() + _START_TIMEOUT_S
        while (frame := self._frame()) is None:  # the server says it is ready
            left = deadline - time.perf_counter()
            chunk = _recv(self._raw, left) if left > 0 else None
            if not chunk:  # nothing in time, or the stream ended
                self.drop()
                why = self.stderr_tail.strip()[-300:] or "it did not answer"
                raise ServerUnavailable(f"no exec server in this container: {why}")
            self._feed(chunk)
        if frame[0] != b"r":
            self.drop()
            raise ServerUnavailable(f"exec server said {frame!r:.200} instead of ready")

    def drop(self) -> None:
        """Forgets the server (it was killed, or the sandbox closes); idempotent."""
        sock, self._sock, self._raw = self._sock, None, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _alive(self) -> bool:
        """Whether the stream is open: reads what is there without waiting (EOF: dead)."""
        raw = self._raw
        if raw is None:
            return False
        while (chunk := _recv(raw, 0)) is not None:
            if not chunk:
                self.drop()
                return False
            self._feed(chunk)
        return True

    # ------------------------------------------------------------------- frames
    def _feed(self, chunk: bytes) -> None:
        """Docker's stream frames: stream 1 is the protocol; stream 2 (the server's
        stderr, e.g. ``python3: not found``) is kept as the reason it failed."""
        self._pending += chunk
        for stream, data in docker_frames(self._pending):
            if stream == 1:
                self._out += data
            else:
                self.stderr_tail = (self.stderr_tail + data.decode(errors="replace"))[-2000:]

    def _frame(self) -> tuple[bytes, bytes] | None:
        if len(self._out) < 5:
            return None
        size = _U32.unpack(self._out[1:5])[0]
        if len(self._out) < 5 + size:
            return None
        kind, payload = bytes(self._out[:1]), bytes(self._out[5 : 5 + size])
        del self._out[: 5 + size]
        return kind, payload

    # --------------------------------------------------------------------- run
    def run(self, req: ExecRequest, deadline: float, on_deadline: Callable[[], None]) -> Raw | None:
        """Runs ``req`` (the caller holds :attr:`lock`).

        At ``deadline`` (the in-container ``timeout`` failed) it calls ``on_deadline()``
        once, which must kill the command, and waits ``grace_s`` more for the end.

        Returns:
            What it did, or None if the command did not end even then.

        Raises:
            ServerUnavailable: Nothing ran (the image has no ``python3``, or the server
                could not be started or could not spawn the command).
        """
        if self.unavailable:
            raise ServerUnavailable(self.unavailable)
        if not self._alive():
            try:
                self._start()
            except ServerUnavailable as e:
                self.unavailable = str(e)  # no python3 in the image: never again
                raise
            except Exception as e:  # the engine failed: the caller's docker exec will say so
                self.drop()
                raise ServerUnavailable(f"could not start the exec server: {e}") from e
        raw = self._raw
        assert raw is not None
        head = json.dumps(
            {"argv": req.argv, "t": req.t, "kb": int(req.kill_background), "cap": req.cap,
             "env": req.env}
        ).encode()  # fmt: skip
        data = req.stdin or b""
        try:
            raw.settimeout(max(0.1, deadline - time.perf_counter()))
            raw.sendall(_U32.pack(len(head)) + head + _U32.pack(len(data)) + data)
        except OSError:  # it died after reading part of the request: it may have run
            self.drop()
            return Raw()
        return self._collect(raw, deadline, on_deadline)

    def _collect(
        self, raw: socket.socket, deadline: float, on_deadline: Callable[[], None] | None
    ) -> Raw | None:
        res = Raw()
        while True:
            frame = self._frame()
            if frame is None:
                left = deadline - time.perf_counter()
                if left <= 0:
                    if on_deadline is None:
                        return None
                    on_deadline()
                    on_deadline, deadline = None, time.perf_counter() + self.grace_s
                    continue
                chunk = _recv(raw, left)
                if chunk is None:
                    continue
                if not chunk:  # the server is gone: killed with (or by) the command
                    self.drop()
                    return res
                self._feed(chunk)
                continue
            kind, payload = frame
            if kind in (b"o", b"e"):
                res.bufs[1 if kind == b"o" else 2] += payload
            elif kind == b"x":
                info = json.loads(payload)
                res.code = int(info["code"])
                res.dropped = {1: int(info["dropped"][0]), 2: int(info["dropped"][1])}
                return res
            else:  # b"f": the server could not spawn it (e.g. the pids limit is hit)
                raise ServerUnavailable(json.loads(payload).get("error", "spawn failed"))
