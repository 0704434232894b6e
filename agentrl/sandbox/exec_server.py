"""The resident exec server: one process inside each Docker sandbox that runs commands on
request, so an exec costs a round trip on an open stream instead of a ``docker exec``.

DockerSandbox starts it once per container with ``docker exec -i`` as the sandbox user,
passing this file's source to ``python3 -c`` and the exec wrapper script
(:data:`agentrl.sandbox.docker_scripts.WRAPPER`) as its argument. Each command then runs
exactly as a ``docker exec`` of the wrapper would run it: under ``timeout -s KILL``, in its
own process group, background processes swept after it, output capped; the server only
spawns the wrapper and relays its output. It uses the standard library only, so it runs
on any image with ``python3`` (3.8 or later); where there is none, DockerSandbox keeps
using ``docker exec``.

The server is not a trust boundary: it runs as the same uid as the code. It makes itself
non-dumpable, so the code cannot ptrace it or write its memory to forge the results of
later commands; the code can still kill it, which costs the next exec a restart.

Protocol, on the server's stdin and stdout (all lengths big-endian u32):

- at start the server sends a ready frame (``r``, empty);
- request: ``len`` + JSON ``{"argv": [...], "t": seconds, "kb": 0|1, "cap": bytes,
  "env": {...} | null}``, then ``len`` + the command's stdin bytes;
- reply: frames of one kind byte + ``len`` + payload: ``o`` stdout bytes, ``e`` stderr
  bytes (each stream's first ``cap`` bytes only), then ``x`` JSON
  ``{"code": exit status, "dropped": [stdout bytes, stderr bytes]}``; or ``f`` JSON
  ``{"error": why}`` when the command could not be spawned at all (nothing ran).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import struct
import subprocess
import sys

_U32 = struct.Struct(">I")


def _read_exact(n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _send(kind: bytes, payload: bytes) -> None:
    view = memoryview(kind + _U32.pack(len(payload)) + payload)
    while view:
        view = view[os.write(1, view) :]


def _no_dump() -> None:
    """PR_SET_DUMPABLE 0: no ptrace, no /proc/PID/mem or fd access by the same uid."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except Exception:  # no ctypes in the image: the server still works
        pass


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)  # type: ignore[attr-defined,unused-ignore]
    except (AttributeError, OSError):  # Python < 3.9, or a kernel/seccomp without it
        return None


def run(wrapper: str, req: dict, stdin: bytes) -> None:
    """Runs one request's command under ``wrapper`` and sends its reply frames."""
    env = dict(os.environ)
    env.update(req.get("env") or {})
    argv = ["sh", "-c", wrapper, "agentrl-exec", f"{req['t']:.3f}", "1" if req["kb"] else "0"]
    try:
        proc = subprocess.Popen(
            argv + list(req["argv"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
    except (OSError, ValueError) as e:
        _send(b"f", json.dumps({"error": str(e)}).encode())
        return
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    cap = int(req["cap"])
    sent, dropped = [0, 0], [0, 0]
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, 0)
    sel.register(proc.stderr, selectors.EVENT_READ, 1)
    if stdin:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, -1)
    else:
        proc.stdin.close()
    # The wrapper's exit ends the call even if something it left (kill_background off)
    # still holds its output pipes open: a pidfd says when, else a 50 ms poll.
    pidfd = _pidfd(proc.pid)
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ, -2)
    exited = False
    while any(key.data != -2 for key in sel.get_map().values()):
        ready = sel.select(0 if exited else None if pidfd is not None else 0.05)
        if not ready:
            if exited:  # exited, and what it wrote is read
                break
            exited = proc.poll() is not None
            continue
        for key, _ in ready:
            fd = key.fd
            if key.data == -2:
                sel.unregister(fd)
                exited = True
                continue
            if key.data == -1:
                try:
                    stdin = stdin[os.write(fd, stdin[: 1 << 16]) :]
                except BrokenPipeError:  # the command stopped reading: drop the rest
                    stdin = b""
                if not stdin:
                    sel.unregister(key.fileobj)
                    proc.stdin.close()
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            i = key.data
            room = max(0, cap - sent[i])
            if room:
                _send(b"oe"[i : i + 1], chunk[:room])
                sent[i] += min(room, len(chunk))
            dropped[i] += len(chunk) - min(room, len(chunk))
    sel.close()
    if pidfd is not None:
        os.close(pidfd)
    code = proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            pipe.close()
    if code < 0:  # the wrapper itself was killed by signal -code: report as a shell would
        code = 128 - code
    _send(b"x", json.dumps({"code": code, "dropped": dropped}).encode())


def main() -> None:
    """Serves requests until stdin closes."""
    wrapper = sys.argv[1]
    _no_dump()
    _send(b"r", b"")  # ready: the image has a python3 that runs this file
    while True:
        try:
            req = json.loads(_read_exact(_U32.unpack(_read_exact(4))[0]))
            stdin = _read_exact(_U32.unpack(_read_exact(4))[0])
        except EOFError:
            return
        run(wrapper, req, stdin)


if __name__ == "__main__":
    main()
