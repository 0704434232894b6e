"""The resident exec server's protocol, spoken to a real server process on the host (the
Docker tests run it in containers). ``kb`` stays 0 here: the background sweep kills
every process of uid 1000, which on a host is not the sandbox's."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agentrl.sandbox import docker_scripts
from agentrl.sandbox.exec_client import _SOURCE

U32 = struct.Struct(">I")


@pytest.fixture
def server() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SOURCE, docker_scripts.WRAPPER],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert _frame(proc) == (b"r", b"")  # ready
    yield proc
    proc.kill()
    proc.wait()


def _frame(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    assert proc.stdout is not None
    head = proc.stdout.read(5)
    return head[:1], proc.stdout.read(U32.unpack(head[1:])[0])


def _call(proc: subprocess.Popen[bytes], argv: list[str], stdin: bytes = b"", **kw: object):
    assert proc.stdin is not None
    req = json.dumps({"argv": argv, "t": 10, "kb": 0, "cap": 100, "env": None, **kw}).encode()
    proc.stdin.write(U32.pack(len(req)) + req + U32.pack(len(stdin)) + stdin)
    proc.stdin.flush()
    out = {b"o": b"", b"e": b""}
    while True:
        kind, payload = _frame(proc)
        if kind in out:
            out[kind] += payload
        else:
            return out[b"o"], out[b"e"], kind, json.loads(payload)


def test_runs_commands_in_turn_with_stdin_env_and_exit_status(server) -> None:
    out, err, kind, end = _call(
        server, ["sh", "-c", "cat; echo $V >&2; exit 7"], b"in", env={"V": "v"}
    )
    assert (out, err, kind, end) == (b"in", b"v\n", b"x", {"code": 7, "dropped": [0, 0]})
    big = b"y" * 300_000  # larger than a pipe buffer, both ways
    out, _, _, end = _call(server, ["cat"], big, cap=1 << 20)
    assert out == big and end["code"] == 0


def test_output_past_the_cap_is_counted_not_sent(server) -> None:
    out, err, _, end = _call(server, ["sh", "-c", "head -c 250 /dev/zero; echo e >&2"])
    assert out == b"\0" * 100 and err == b"e\n" and end["dropped"] == [150, 0]


def test_the_timeout_and_signals_give_shell_statuses(server) -> None:
    assert _call(server, ["sleep", "5"], t=0.3)[3]["code"] == 137  # timeout -s KILL
    assert _call(server, ["sh", "-c", "kill -TERM $$"])[3]["code"] == 143


def test_a_command_that_cannot_spawn_fails_without_running(server) -> None:
    _, _, kind, end = _call(server, ["echo", "nul\0byte"])
    assert kind == b"f" and "null" in end["error"]
    assert _call(server, ["echo", "next"])[0] == b"next\n"  # the server goes on


def test_a_background_holder_of_the_pipes_does_not_hold_the_call(server) -> None:
    import time

    t0 = time.perf_counter()
    out, _, _, end = _call(server, ["sh", "-c", "sleep 3 & echo started"])
    assert out == b"started\n" and end["code"] == 0 and time.perf_counter() - t0 < 2
