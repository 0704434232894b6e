"""LocalSandbox: each containment claim, proven on a real process, with the host healthy after.

Every attack test would fail without its containment: hosts files are made world-readable
/ writable so only the namespace hides them, the network test first reaches its listener
from the host (and from a sandbox with network allowed), the fork and memory bombs count
what they got, and so on.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.sandbox import LocalSandbox, SandboxError, SandboxLimits
from tests.helpers.sandbox import LIMITS, assert_host_healthy, namespaces_work, procs_of_uid

pytestmark = pytest.mark.skipif(
    not namespaces_work(), reason="LocalSandbox needs root, util-linux unshare and namespaces"
)


def listing(path: str | Path) -> list[str]:
    return sorted(os.listdir(path))


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A world-accessible host directory: only the sandbox's namespaces can keep code out."""
    path = Path(tempfile.mkdtemp(prefix="agentrl-host-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_runs_code_unprivileged_in_its_workdir() -> None:
    async with LocalSandbox(LIMITS) as sb:
        r = await sb.exec("id -u; pwd; echo $HOME")
        assert r.ok and r.stdout.split() == [str(sb.uid), "/workspace", "/workspace"]
        assert sb.uid != 0
        r = await sb.exec(
            ["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"], stdin="abc"
        )
        assert r.stdout == "cba\n"
        r = await sb.exec("echo $FOO; exit 3", env={"FOO": "bar"})
        assert (r.stdout, r.exit_code, r.ok) == ("bar\n", 3, False)
        r = await sb.run_code("print(6 * 7)")
        assert r.ok and r.stdout == "42\n"
        await sb.write_file("pkg/data.txt", "hello")
        assert (await sb.exec("cat pkg/data.txt; echo more >> pkg/data.txt")).stdout == "hello"
        assert await sb.read_file("/workspace/pkg/data.txt") == b"hellomore\n"


async def test_concurrent_and_cancelled_calls_keep_it_usable() -> None:
    async with LocalSandbox(LIMITS) as sb:
        results = await asyncio.gather(*(sb.exec(f"echo {i}") for i in range(5)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(5)]
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sb.exec("sleep 0.5; echo late"), 0.1)
        r = await sb.exec("echo next")  # the cancelled call's reply is not mistaken for this one
        assert r.stdout == "next\n"
        await assert_host_healthy(sb)


async def test_infinite_loop_is_killed_at_wall_timeout() -> None:
    async with LocalSandbox(LIMITS) as sb:
        t0 = time.monotonic()
        r = await sb.run_code("while True: pass", timeout_s=1.0)
        assert r.timed_out and not r.ok and r.exit_code == -9
        assert time.monotonic() - t0 < 2.5
        await assert_host_healthy(sb)


async def test_cpu_time_limit_kills_a_busy_process() -> None:
    async with LocalSandbox(SandboxLimits(cpu_time_s=1, wall_timeout_s=10.0)) as sb:
        r = await sb.run_code("while True: pass")
        assert not r.timed_out and r.exit_code in (-24, -9)  # SIGXCPU, then SIGKILL at hard
        assert r.duration_s < 5
        await assert_host_healthy(sb)


async def test_timeout_kills_the_whole_process_tree() -> None:
    async with LocalSandbox(LIMITS) as sb:
        cmd = "sleep 60 & (setsid sleep 61 &); nohup sleep 62 >/dev/null 2>&1 & sleep 63"
        r = await sb.exec(cmd, timeout_s=1.0)
        assert r.timed_out
        await assert_host_healthy(sb)  # no sleep of the sandbox's uid is left on the host


async def test_leftover_children_do_not_survive_the_call() -> None:
    async with LocalSandbox(LIMITS) as sb:
        r = await sb.exec("sleep 60 & setsid sh -c 'sleep 61' >/dev/null 2>&1 & echo started")
        assert r.ok and r.stdout == "started\n" and r.duration_s < 2
        await assert_host_healthy(sb)
        r = await sb.exec("ps -e -o comm=")
        assert "sleep" not in r.stdout


async def test_fork_bomb_is_contained() -> None:
    counter = (
        "import os, time\nn = 0\nfor _ in range(200):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    n += 1\nprint(n)\n"
    )
    async with LocalSandbox(LIMITS) as sb:
        r = await sb.run_code(counter)
        assert r.ok, r
        assert int(r.stdout) < LIMITS.max_processes  # without a limit: 200
        r = await sb.exec("b() { b | b & }; b; sleep 5", timeout_s=2.0)
        await assert_host_healthy(sb)


async def test_memory_bomb_is_contained() -> None:
    async with LocalSandbox(LIMITS) as sb:
        # A generous wall clock: on a loaded machine Python's start-up alone can take seconds,
        # and the test is about the memory limit, not the timeout.
        r = await sb.run_code("x = bytearray(1 << 30)", timeout_s=30)  # 1 GiB; the host has more
        assert r.exit_code == 1 and "MemoryError" in r.stderr
        r = await sb.run_code("xs = []\nwhile True: xs.append(b'x' * (16 << 20))", timeout_s=30)
        assert r.exit_code == 1 and "MemoryError" in r.stderr and not r.timed_out
        await assert_host_healthy(sb)


async def test_disk_fill_is_bounded(host_dir: Path) -> None:
    fill = (
        "import errno, json\nbig = total = 0\n"
        "try:\n    open('big', 'wb').write(b'x' * (4 << 20))\nexcept OSError as e:\n"
        "    big = e.errno\n"
        "for i in range(64):\n    path = ('/tmp/f%d' if i % 2 else 'f%d') % i\n"
        "    try:\n        with open(path, 'wb') as f:\n            f.write(b'x' * (1 << 20))\n"
        "    except OSError as e:\n        print(json.dumps([big, e.errno])); break\n"
    )
    async with LocalSandbox(LIMITS, workdir_root=str(host_dir)) as sb:
        r = await sb.run_code(fill)
        assert json.loads(r.stdout) == [27, 28], r  # EFBIG for one file, ENOSPC for all
        used = await sb.exec("du -sk /workspace /tmp | awk '{s += $1} END {print s}'")
        assert int(used.stdout) <= LIMITS.max_disk_mb * 1024
        assert sb._root is not None and listing(host_dir) == [os.path.basename(sb._root)]
        assert listing(sb._root) == []  # nothing landed on the host disk
        await assert_host_healthy(sb)
        await sb.reset()
        assert (await sb.exec("head -c 1048576 /dev/zero > again")).ok


async def test_cannot_read_host_files(host_dir: Path) -> None:
    token = secrets.token_hex(8)
    secret = host_dir / "secret.txt"
    secret.write_text(token)
    secret.chmod(0o644)
    assert os.stat(secret).st_mode & 0o004  # any uid could read it, were it visible
    targets = [str(secret), "/etc/shadow", "/root/.bashrc", __file__, "/proc/1/root/etc/shadow"]
    async with LocalSandbox(LIMITS) as sb:
        r = await sb.exec(
            "for f in " + " ".join(targets) + "; do cat $f && echo READ $f; done; "
            "ls /root /home /work /srv /mnt; grep -rl " + token + " /etc /tmp /workspace /dev"
        )
        assert token not in r.stdout and "READ" not in r.stdout
        assert (await sb.exec("ls /")).stdout.split() == [
            "bin", "dev", "etc", "lib", "lib64", "proc", "sbin", "tmp", "usr", "workspace",
        ]  # fmt: skip
        await assert_host_healthy(sb)
    assert secret.read_text() == token


async def test_cannot_write_outside_workdir(host_dir: Path) -> None:
    canary = host_dir / "canary.txt"
    canary.write_text("intact")
    canary.chmod(0o666)  # any uid could overwrite it, were it visible
    attempts = [str(canary), "/usr/evil", "/etc/evil", "/evil", "/proc/evil", str(host_dir / "new")]
    async with LocalSandbox(LIMITS) as sb:
        script = "; ".join(f"(echo pwned > {p}) 2>/dev/null && echo WROTE {p}" for p in attempts)
        r = await sb.exec(script + "; echo ok > /workspace/a && echo ok > /tmp/b && echo inside")
        assert "WROTE" not in r.stdout and r.stdout.endswith("inside\n"), r
        await assert_host_healthy(sb)
    assert canary.read_text() == "intact"
    assert listing(host_dir) == ["canary.txt"]
    assert "evil" not in listing("/usr") and "evil" not in listing("/")


async def test_file_api_rejects_paths_outside_workdir() -> None:
    async with LocalSandbox(LIMITS) as sb:
        for bad in ("../etc/passwd", "/etc/passwd", "a/../../x"):
            with pytest.raises(ValueError, match="outside"):
                await sb.write_file(bad, "x")
            with pytest.raises(ValueError, match="outside"):
                await sb.read_file(bad)
        await sb.exec("ln -s /etc/passwd link; ln -s / rootlink")
        with pytest.raises(ValueError, match="link"):
            await sb.read_file("link")
        with pytest.raises(ValueError, match="rootlink"):
            await sb.write_file("rootlink/etc/evil", "x")
        await assert_host_healthy(sb)


async def test_no_network() -> None:
    accepted = 0

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = (
        "import json, socket\nout = []\n"
        f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 80), ('8.8.8.8', 53)]:\n"
        "    try:\n        socket.create_connection(addr, timeout=1).close(); out.append('ok')\n"
        "    except OSError as e:\n        out.append(e.errno)\nprint(json.dumps(out))\n"
    )
    async with server:
        _, writer = await asyncio.open_connection("127.0.0.1", port)  # reachable from the host
        writer.close()
        async with LocalSandbox(SandboxLimits(network=True)) as open_sb:  # the probe works
            assert json.loads((await open_sb.run_code(probe)).stdout)[0] == "ok"
        before = accepted
        async with LocalSandbox(LIMITS) as sb:
            r = await sb.run_code(probe)
            assert json.loads(r.stdout) == [101, 101, 101], r  # ENETUNREACH: no route at all
            assert accepted == before
            await assert_host_healthy(sb)


async def test_output_is_cut_with_a_marker() -> None:
    async with LocalSandbox(LIMITS) as sb:
        r = await sb.exec("head -c 1000000 /dev/zero | tr '\\0' a; echo err >&2")
        assert r.ok and r.stdout.startswith("a" * LIMITS.max_output_bytes)
        assert r.stdout.endswith(f"[... output truncated: {1000000 - 4096} more bytes]")
        assert r.stderr == "err\n"
        r = await sb.exec("yes", timeout_s=1.0)
        assert r.timed_out and len(r.stdout) < LIMITS.max_output_bytes + 100
        await assert_host_healthy(sb)


async def test_cannot_regain_root() -> None:
    async with LocalSandbox(LIMITS) as sb:
        r = await sb.run_code("import os\nos.setuid(0)")
        assert r.exit_code == 1 and "PermissionError" in r.stderr
        r = await sb.exec("grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status")
        assert r.stdout.split() == ["CapEff:", "0" * 16, "CapBnd:", "0" * 16, "NoNewPrivs:", "1"]
        await assert_host_healthy(sb)


async def test_reset_wipes_the_sandbox() -> None:
    async with LocalSandbox(LIMITS) as sb:
        await sb.write_file("a.txt", "x")
        await sb.exec("mkdir -p d/e && touch /tmp/t /dev/shm/s .hidden")
        await sb.reset()
        r = await sb.exec("ls -A /workspace /tmp /dev/shm")
        assert r.stdout.split() == ["/dev/shm:", "/tmp:", "/workspace:"]


async def test_close_is_idempotent_and_leaves_nothing() -> None:
    root = tempfile.mkdtemp(prefix="agentrl-root-")
    sb = LocalSandbox(LIMITS, workdir_root=root)
    await sb.start()
    await sb.start()
    assert sb.alive and len(os.listdir(root)) == 1
    await sb.close()
    await sb.close()
    assert not sb.alive and os.listdir(root) == [] and procs_of_uid(sb.uid) == []
    os.rmdir(root)
    with pytest.raises(SandboxError):
        await sb.exec("true")


async def test_helper_death_is_a_sandbox_error() -> None:
    async with LocalSandbox(LIMITS) as sb:
        assert sb._proc is not None
        assert await sb.healthy()
        os.killpg(sb._proc.pid, 9)
        with pytest.raises(SandboxError):
            await sb.exec("true")
        assert not sb.alive and not await sb.healthy()
    assert procs_of_uid(sb.uid) == []


async def test_ro_binds_are_visible_but_read_only() -> None:
    shared = Path(tempfile.mkdtemp(prefix="agentrl-ro-", dir="/var/tmp"))  # not the private /tmp
    try:
        os.chmod(shared, 0o755)
        (shared / "lib.py").write_text("X = 1\n")
        async with LocalSandbox(LIMITS, ro_binds=(str(shared),)) as sb:
            r = await sb.exec(f"cat {shared}/lib.py; echo 2 > {shared}/lib.py || echo denied")
            assert r.stdout == "X = 1\ndenied\n"
        assert (shared / "lib.py").read_text() == "X = 1\n"
    finally:
        shutil.rmtree(shared)
    with pytest.raises(ValueError, match="overlaps"):
        LocalSandbox(ro_binds=("/tmp/x",))
