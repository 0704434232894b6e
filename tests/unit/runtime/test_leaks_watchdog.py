"""The watchdog and the reaper release what a process leaves when it dies, SIGKILL included.

Real processes: an owner in a subprocess registers a path, is killed, and the path must go.
"""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from agentrl.inference.reaper import shm_in_use
from agentrl.runtime.watchdog import proc_start

OWNER = textwrap.dedent(
    """
    import os, signal, sys, time
    from agentrl.runtime.watchdog import unwatch_path, watch_path
    # Ctrl-C ends it as it ends any Python program, even when started by a shell that
    # ignores SIGINT in background jobs (the ignore would be inherited).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    path = sys.argv[1]
    os.makedirs(path + "/sub", exist_ok=True)
    open(path + "/sub/w.safetensors", "wb").write(b"x" * 1000)
    watch_path(path)
    if sys.argv[2] == "unwatch":
        unwatch_path(path)
    print("ready", flush=True)
    if sys.argv[2] == "raise":
        raise RuntimeError("boom")
    if sys.argv[2] in ("exit", "unwatch"):
        sys.exit(0)
    time.sleep(600)
    """
)


def _wait_gone(check, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def _watchdogs_of(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmd = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"agentrl.runtime.watchdog" in cmd and str(pid).encode() in cmd:
                out.append(int(name))
    return out


def _owner(tmp_path: Path, how: str) -> tuple[subprocess.Popen[str], Path]:
    target = tmp_path / f"agentrl-weights-{uuid.uuid4().hex[:8]}"
    p = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(target), how], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p, target


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_a_killed_owner_s_path_is_removed(tmp_path: Path, sig: int) -> None:
    p, target = _owner(tmp_path, "sleep")
    assert target.is_dir()
    (dog,) = _watchdogs_of(p.pid)
    p.send_signal(sig)
    p.wait(10)
    assert _wait_gone(lambda: not target.exists()), f"{target} left after signal {sig}"
    assert _wait_gone(lambda: not proc_start(dog)), "the watchdog did not exit"


@pytest.mark.parametrize("how", ["exit", "raise"])
def test_an_owner_that_ends_without_cleaning_up_is_cleaned_after(tmp_path: Path, how: str):
    p, target = _owner(tmp_path, how)
    p.wait(10)
    assert _wait_gone(lambda: not target.exists())


def test_an_unwatched_path_is_kept(tmp_path: Path) -> None:
    p, target = _owner(tmp_path, "unwatch")
    dogs = _watchdogs_of(p.pid)
    p.wait(10)
    assert _wait_gone(lambda: not any(proc_start(d) for d in dogs))
    assert target.is_dir()


def test_the_watchdog_ignores_the_terminal_s_ctrl_c(tmp_path: Path) -> None:
    p, target = _owner(tmp_path, "sleep")
    (dog,) = _watchdogs_of(p.pid)

    def ignores_sigint() -> bool:  # the watchdog has set itself up
        status = Path(f"/proc/{dog}/status").read_text()
        ign = next(line for line in status.splitlines() if line.startswith("SigIgn:"))
        return bool(int(ign.split()[1], 16) & (1 << (signal.SIGINT - 1)))

    assert _wait_gone(ignores_sigint)
    os.kill(dog, signal.SIGINT)
    time.sleep(0.5)
    assert proc_start(dog) and target.exists()
    p.kill()
    p.wait(10)
    assert _wait_gone(lambda: not target.exists())


SHM_MAKER = textwrap.dedent(
    """
    import mmap, os, sys, time
    fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    m = mmap.mmap(fd, 4096)
    print("ready", sys.argv[1], flush=True)
    time.sleep(600)
    """
)
# As vLLM's workers make them: a spawn-context lock is a POSIX semaphore (sem.mp-*) that
# glibc maps under a temporary name before linking it to its own, and that only the
# maker's resource tracker (killed with the group) would unlink.
SEM_MAKER = textwrap.dedent(
    """
    import multiprocessing, sys, time
    lock = multiprocessing.get_context("spawn").Lock()
    print("ready", "/dev/shm/sem." + lock._semlock.name.lstrip("/"), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this system")
@pytest.mark.parametrize("kind", ["psm_", "sem.mp-", "semaphore"])
def test_the_reaper_removes_shared_memory_a_killed_server_left(kind: str) -> None:
    """A server SIGKILLed (as the OOM killer would) leaves its psm_ segment, and its
    workers' multiprocessing semaphores (sem.mp-*): the reaper that outlives it removes
    them."""
    from agentrl.inference.reaper import kill_members

    maker = (
        [SEM_MAKER]
        if kind == "semaphore"
        else [SHM_MAKER, f"/dev/shm/{kind}agentrl_test_{uuid.uuid4().hex[:8]}"]
    )
    reaper = subprocess.Popen(
        [sys.executable, "-m", "agentrl.inference.reaper", "--parent", str(os.getpid()),
         "--grace", "2", "--", sys.executable, "-c", *maker],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    seg = ""
    try:
        assert reaper.stdout is not None
        ready, seg = reaper.stdout.readline().split()
        assert ready == "ready" and os.path.exists(seg)
        time.sleep(2.5)  # one scan of the group's mappings
        kill_members(reaper.pid)
        reaper.wait(20)
        assert not os.path.exists(seg)
    finally:
        if reaper.poll() is None:
            os.killpg(reaper.pid, signal.SIGKILL)
        if seg and os.path.exists(seg):
            os.unlink(seg)


def test_shm_in_use_lists_mapped_and_open_segments(tmp_path: Path) -> None:
    seg = f"/dev/shm/psm_agentrl_test_{uuid.uuid4().hex[:8]}"
    fd = os.open(seg, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4096)
        with mmap.mmap(fd, 4096):
            assert seg in shm_in_use([os.getpid()])
    finally:
        os.close(fd)
        os.unlink(seg)


LOCAL_SANDBOX = textwrap.dedent(
    """
    import asyncio, json
    from agentrl.sandbox import LocalSandbox

    async def main():
        sb = LocalSandbox()
        await sb.start()
        r = await sb.exec("sleep 300 & echo started")
        assert "started" in r.stdout
        print(json.dumps({"unshare": sb._proc.pid, "root": sb._root}), flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def _local_sandbox_works() -> bool:
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "true"]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _local_sandbox_works(), reason="LocalSandbox needs root and namespaces")
def test_a_killed_owner_s_local_sandbox_dies_and_its_root_dir_goes() -> None:
    import json

    p = subprocess.Popen([sys.executable, "-c", LOCAL_SANDBOX], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        got = json.loads(p.stdout.readline())
        assert proc_start(got["unshare"]) and os.path.isdir(got["root"])
    finally:
        p.kill()
        p.wait(10)
    assert _wait_gone(lambda: not proc_start(got["unshare"]), 30), "sandbox helper left"
    assert _wait_gone(lambda: not os.path.exists(got["root"]), 10), "sandbox root dir left"
