"""LocalSandbox holes found by review (issue #18): FIFOs given to the file API, and nested
user namespaces (uid 0 with every capability inside). Each test is a real attempt.
"""

from __future__ import annotations

import asyncio
import platform
import time
from pathlib import Path

import pytest

from agentrl.sandbox import LocalSandbox
from tests.helpers.sandbox import LIMITS, assert_host_healthy, namespaces_work

pytestmark = pytest.mark.skipif(
    not namespaces_work(), reason="LocalSandbox needs root, util-linux unshare and namespaces"
)


async def test_fifos_are_refused_not_waited_on() -> None:
    async with LocalSandbox(LIMITS) as sb:
        r = await sb.exec("mkfifo fifo && mkdir d && mkfifo d/inner && echo made")
        assert r.stdout == "made\n", r
        t0 = time.perf_counter()
        for path in ("fifo", "d/inner", "/workspace/fifo"):
            with pytest.raises(ValueError, match="not a regular file"):
                await asyncio.wait_for(sb.read_file(path), 10)
            with pytest.raises(ValueError, match="not a regular file"):
                await asyncio.wait_for(sb.write_file(path, "x"), 10)
        with pytest.raises(ValueError, match="not a regular file"):
            await sb.write_file("d", "x")  # a directory
        assert time.perf_counter() - t0 < 5  # answered at once, nothing waited for a peer
        # A FIFO with a reader on the other end is refused too (the open would not block).
        r = await sb.exec("(cat fifo > got &) ; sleep 0.2; echo started", timeout_s=5)
        with pytest.raises(ValueError, match="not a regular file"):
            await sb.write_file("fifo", "x")
        await sb.write_file("plain.txt", "ok")  # regular files still work both ways
        assert await sb.read_file("plain.txt") == b"ok"
        assert (await sb.exec("ls -l fifo | cut -c1")).stdout == "p\n"  # left as it was
        await assert_host_healthy(sb)


def _probe() -> str:
    """Shell that tries every way to a new user namespace and prints what each got."""
    clone = ""
    if platform.machine() == "x86_64":  # raw clone(CLONE_NEWUSER | SIGCHLD), like fork
        clone = (
            "python3 -c 'import ctypes, os\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)\n"
            "if pid == 0: os._exit(0)\n"
            "if pid > 0: os.waitpid(pid, 0)\n"
            'print("clone", "NEWUSER" if pid > 0 else ctypes.get_errno())\'\n'
        )
    return (
        "unshare -U -r id -u 2>&1; echo unshare-rc=$?\n"
        "python3 -c 'import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        'rc = libc.unshare(0x10000000)\nprint("unshare", "NEWUSER" if rc == 0 else '
        "ctypes.get_errno())'\n" + clone
    )


def _user_namespaces_allowed() -> bool:
    max_ns = Path("/proc/sys/user/max_user_namespaces")
    return max_ns.exists() and int(max_ns.read_text()) > 0


@pytest.mark.skipif(
    not _user_namespaces_allowed(), reason="this kernel allows no user namespaces: none to refuse"
)
async def test_nested_user_namespaces_are_refused() -> None:
    async with LocalSandbox(LIMITS) as sb:
        r = await sb.exec(_probe())
        assert "uid=0" not in r.stdout and "\n0\n" not in "\n" + r.stdout, r
        assert "unshare-rc=1" in r.stdout and "NEWUSER" not in r.stdout, r
        assert "unshare 1" in r.stdout  # EPERM
        if platform.machine() == "x86_64":
            assert "clone 1" in r.stdout, r
        # Threads (clone3 -> ENOSYS -> clone fallback), fork and subprocesses still work.
        r = await sb.run_code(
            "import threading, subprocess\nout = []\n"
            "t = threading.Thread(target=out.append, args=('thread',)); t.start(); t.join()\n"
            "print(out[0], subprocess.run(['echo', 'child'], capture_output=True, "
            "text=True).stdout.strip())\n"
        )
        assert r.ok and r.stdout == "thread child\n", r
        await assert_host_healthy(sb)
