"""Escape and abuse suite: model-style attacks run in DockerSandbox and are contained.

Each test shows the attack fails (and, where it can, a control showing it would have
worked without the containment), then that the host and a second sandbox stay healthy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentrl.sandbox.docker import DockerSandbox
from agentrl.sandbox.images import docker_client
from tests.integration import docker_fixtures
from tests.integration.docker_fixtures import LIMITS, ps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
docker_image = docker_fixtures.docker_image  # the session fixture, under its own name


@pytest.fixture
async def pair(docker_image: str) -> AsyncIterator[tuple[DockerSandbox, DockerSandbox]]:
    """The attacker's sandbox and a bystander sandbox."""
    a, b = DockerSandbox(docker_image, LIMITS), DockerSandbox(docker_image, LIMITS)
    await asyncio.gather(a.start(), b.start())
    try:
        yield a, b
    finally:
        await asyncio.gather(a.close(), b.close())


async def assert_healthy(*boxes: DockerSandbox) -> None:
    """The host can fork and has memory; each sandbox still runs code."""
    proc = await asyncio.create_subprocess_exec("true")
    assert await proc.wait() == 0
    meminfo = await asyncio.to_thread(Path("/proc/meminfo").read_text)
    avail_kb = int(meminfo.split("MemAvailable:")[1].split()[0])
    assert avail_kb > 512 * 1024
    for sb in boxes:
        r = await sb.exec("echo alive", timeout_s=10)
        assert r.ok and r.stdout == "alive\n", r


async def test_network_is_unreachable(pair: tuple[DockerSandbox, DockerSandbox]) -> None:
    a, b = pair
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # control: host reaches it
        probe = (
            "import socket\n"
            f"try:\n socket.create_connection(('127.0.0.1', {port}), 2); print('CONNECTED')\n"
            "except OSError as e: print('blocked', e)\n"
            "print('ifaces', sorted(l.split(':')[0].strip() for l in open('/proc/net/dev')"
            ".readlines()[2:]))\nprint('routes', len(open('/proc/net/route').readlines()) - 1)\n"
        )
        r = await a.run_code(probe)
        assert "CONNECTED" not in r.stdout and "blocked" in r.stdout, r
        assert "ifaces ['lo']" in r.stdout and "routes 0" in r.stdout, r.stdout
        # Control: the same probe with the network opted in does connect.
        host_net = dataclasses.replace(LIMITS, network=True)
        async with DockerSandbox(a.image, host_net, network="host") as open_box:
            assert "CONNECTED" in (await open_box.run_code(probe)).stdout
    finally:
        srv.close()
    await assert_healthy(a, b)


async def test_host_files_are_not_readable(pair: tuple[DockerSandbox, DockerSandbox]) -> None:
    a, b = pair
    secret = Path("/tmp") / f"agentrl-secret-{uuid.uuid4().hex}"
    secret.write_text("TOPSECRET")
    try:
        assert secret.read_text() == "TOPSECRET"  # control: it is there on the host
        r = await a.exec(
            f"cat {secret}; cat /proc/1/root{secret}; grep -rs TOPSECRET /tmp /proc/1/root/tmp;"
            " ls /var/run/docker.sock; ls /proc | grep -c '^[0-9]'"
        )
        assert "TOPSECRET" not in r.stdout + r.stderr
        assert "docker.sock': No such file" in r.stderr
        assert int(r.stdout.split()[-1]) < 12  # only its own few processes are visible
    finally:
        secret.unlink()
    await assert_healthy(a, b)


async def test_cannot_write_outside_workdir(pair: tuple[DockerSandbox, DockerSandbox]) -> None:
    a, b = pair
    # /home/agent belongs to uid 1000 in the image: only the read-only root stops the write.
    r = await a.exec("stat -c %u /home/agent; touch /home/agent/x; touch /etc/x /x /usr/bin/x")
    assert r.stdout == "1000\n"
    assert "/home/agent/x': Read-only file system" in r.stderr, r.stderr
    assert r.stderr.count("touch: cannot touch") == 4
    r = await a.exec("touch /workspace/ok /tmp/ok && ls /workspace/ok /tmp/ok")
    assert r.ok, r
    assert (await b.exec("ls /workspace/ok /tmp/ok")).exit_code != 0  # not in the neighbour
    await assert_healthy(a, b)


async def test_cannot_reach_another_sandbox(pair: tuple[DockerSandbox, DockerSandbox]) -> None:
    a, b = pair
    server = (
        "import socket\ns = socket.create_server(('0.0.0.0', 8765))\ns.settimeout(6)\n"
        "try:\n c, _ = s.accept(); c.sendall(b'HELLO')\nexcept OSError: pass\n"
    )
    client = (
        "import socket, time\n"
        "for _ in range(20):\n"
        " try:\n  print(socket.create_connection(('127.0.0.1', 8765), 1).recv(5)); break\n"
        " except OSError as e: err = e; time.sleep(0.2)\n"
        "else: print('refused', err)\n"
    )
    srv = asyncio.create_task(a.run_code(server, timeout_s=8))
    await asyncio.sleep(0.5)
    from_b = await b.run_code(client, timeout_s=8)
    from_a = await a.run_code(client, timeout_s=8)  # control: inside A the server is reachable
    await srv
    assert "b'HELLO'" in from_a.stdout, from_a
    assert "refused" in from_b.stdout and "HELLO" not in from_b.stdout, from_b
    await a.write_file("a-secret.txt", "A")
    r = await b.exec("ls -A /workspace; ps -eo args")
    assert "a-secret" not in r.stdout and "create_server" not in r.stdout
    await assert_healthy(a, b)


async def test_fork_bomb_is_contained(pair: tuple[DockerSandbox, DockerSandbox]) -> None:
    a, b = pair
    # Control: more processes than the limit cannot even be started.
    r = await a.exec("for i in $(seq 40); do sleep 3 & done; wait", timeout_s=10)
    assert "Resource temporarily unavailable" in r.stderr or "fork" in r.stderr, r
    r = await a.exec("bomb() { bomb | bomb & }; bomb; sleep 5", timeout_s=3)
    await asyncio.sleep(0.5)
    left = ps((await a.exec("ps -eo args")).stdout)
    assert len(left) <= 3, left  # tini, the idle sleep, maybe a zombie being reaped
    await assert_healthy(a, b)


async def test_memory_bomb_is_killed(pair: tuple[DockerSandbox, DockerSandbox]) -> None:
    a, b = pair
    ok = await a.run_code("x = b'x' * (32 << 20); print(len(x))")
    assert ok.ok and ok.stdout == "33554432\n"
    r = await a.run_code("x = b'x' * (1 << 30); print('ALLOCATED')")  # 1 GiB > 128 MiB limit
    assert "ALLOCATED" not in r.stdout
    assert r.exit_code == -9 and not r.timed_out, r  # the OOM killer, not the clock
    await assert_healthy(a, b)


async def test_disk_fill_is_capped(pair: tuple[DockerSandbox, DockerSandbox]) -> None:
    a, b = pair
    r = await a.exec(
        "for i in 1 2 3 4 5 6; do dd if=/dev/zero of=/workspace/f$i bs=1M count=10 2>&1; done;"
        " du -sm /workspace | cut -f1"
    )
    assert "No space left on device" in r.stdout
    assert int(r.stdout.split()[-1]) <= LIMITS.max_disk_mb  # 60 MiB asked, 32 MiB allowed
    r = await a.exec(
        "for i in 1 2 3; do dd if=/dev/zero of=/tmp/f$i bs=1M count=10 2>&1; done;"
        " du -sm /tmp | cut -f1"
    )
    assert "No space left" in r.stdout and int(r.stdout.split()[-1]) <= 16
    # One file larger than max_file_size_mb (16) dies of SIGXFSZ even with room left.
    r = await a.exec("rm -f /workspace/f* /tmp/f*; dd if=/dev/zero of=one bs=1M count=20")
    assert r.exit_code == -25 or "File too large" in r.stderr, r
    await assert_healthy(a, b)


async def test_infinite_loops_are_stopped(pair: tuple[DockerSandbox, DockerSandbox]) -> None:
    a, b = pair
    r = await a.run_code("while True: pass", timeout_s=1.5)
    assert r.timed_out and r.exit_code == -9 and r.duration_s < 5
    cmd = "setsid python3 -c 'while True: pass' & trap '' TERM INT; while :; do :; done"
    r = await a.exec(cmd, timeout_s=1.5)
    assert r.timed_out
    await asyncio.sleep(0.3)
    assert not [p for p in ps((await a.exec("ps -eo args")).stdout) if "while" in p]
    cpu = dataclasses.replace(LIMITS, cpu_time_s=1)
    async with DockerSandbox(a.image, cpu) as c:  # RLIMIT_CPU: 1 CPU second, then SIGXCPU
        r = await c.run_code("while True: pass", timeout_s=15)
        assert not r.timed_out and r.exit_code in (-24, -9), r
    await assert_healthy(a, b)


async def test_background_processes_do_not_outlive_the_call(
    pair: tuple[DockerSandbox, DockerSandbox], docker_image: str
) -> None:
    a, b = pair
    attack = (
        "sleep 301 & nohup sleep 302 >/dev/null 2>&1 &"
        " setsid sleep 303 >/dev/null 2>&1 </dev/null & (setsid sh -c 'sleep 304' &) ; echo spawned"
    )
    assert (await a.exec(attack)).stdout == "spawned\n"
    assert not [p for p in ps((await a.exec("ps -eo args")).stdout) if "sleep 30" in p]
    # Control: with the sweep off they do survive (and reset() kills them).
    async with DockerSandbox(docker_image, LIMITS, kill_background=False) as keep:
        await keep.exec(attack)
        alive = [p for p in ps((await keep.exec("ps -eo args")).stdout) if "sleep 30" in p]
        assert {f"sleep 30{i}" for i in range(1, 5)} <= set(alive), alive
        await keep.reset()
        assert not [p for p in ps((await keep.exec("ps -eo args")).stdout) if "sleep 30" in p]
    host = await asyncio.create_subprocess_exec("ps", "-eo", "args", stdout=subprocess.PIPE)
    out, _ = await host.communicate()
    # This test's sleeps only: another module's containers (their processes are the
    # host's too) may be running a `sleep 30` of their own meanwhile.
    ours = {f"sleep 30{i}" for i in range(1, 5)}
    assert not [p for p in out.decode().splitlines() if p.strip() in ours]
    await assert_healthy(a, b)


async def test_privileges_cannot_be_gained(pair: tuple[DockerSandbox, DockerSandbox]) -> None:
    a, b = pair
    r = await a.exec(
        "grep -E '^(Uid|CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status"
    )
    status = dict(line.split(":\t", 1) for line in r.stdout.splitlines())
    assert status["Uid"].split()[:2] == ["1000", "1000"]
    for cap in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        assert int(status[cap], 16) == 0, (cap, status[cap])
    assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2"
    # /bin/mount is setuid root in the image: no-new-privileges makes the bit inert.
    r = await a.exec("stat -c '%a %U' /bin/mount; mkdir -p m; mount -t tmpfs none m; echo rc=$?")
    assert r.stdout.startswith("4755 root") and "rc=0" not in r.stdout
    r = await a.run_code(
        "import os\n"
        "for f in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.chroot('/')):\n"
        " try: f(); print('GAINED')\n except PermissionError: print('denied')\n"
    )
    assert r.stdout == "denied\ndenied\ndenied\n"
    r = await a.exec("unshare -r id -u; unshare -m true; echo done")
    assert "done" in r.stdout and r.stdout.strip() == "done", r
    # Seen from the host, nothing the sandbox runs is root.
    top = await asyncio.to_thread(
        docker_client().api.top, a.container_id, ps_args="-eo pid,uid,args"
    )
    col = top["Titles"].index("UID")
    uids = {row[col].strip() for row in top["Processes"]}
    assert uids and "0" not in uids, top
    await assert_healthy(a, b)


async def test_file_api_resolves_paths_as_the_sandbox_user(
    pair: tuple[DockerSandbox, DockerSandbox],
) -> None:
    a, b = pair
    # Control: /etc/shadow exists in the image and uid 1000 cannot read it.
    r = await a.exec("cat /etc/shadow; ln -s / link; ln -s /etc/shadow shadow; ln -s /tmp t")
    assert "Permission denied" in r.stderr and "root:" not in r.stdout, r
    for path in ("link/etc/shadow", "shadow", "t/x", "link/etc"):
        with pytest.raises(ValueError) as err:
            await a.read_file(path)
        assert "root:" not in str(err.value)
    with pytest.raises(ValueError, match="outside the working directory"):
        await a.download("link/etc", Path("/nonexistent-never-made"))
    for path in ("link/etc/evil", "t/evil", "shadow"):
        with pytest.raises(ValueError):
            await a.write_file(path, "x")
    assert (await a.exec("ls /tmp; readlink shadow")).stdout == "/etc/shadow\n"
    with pytest.raises(FileNotFoundError):
        await a.read_file("missing.txt")
    # FIFOs are refused at once, not waited on.
    await a.exec("mkfifo fifo")
    with pytest.raises(ValueError, match="not a regular file"):
        await asyncio.wait_for(a.read_file("fifo"), 10)
    with pytest.raises(ValueError, match="not a regular file"):
        await asyncio.wait_for(a.write_file("fifo", "x"), 10)
    # Ordinary files: any bytes round-trip, parents are made, owned by the sandbox user.
    blob = bytes(range(256)) * 4
    await a.write_file("d/e/blob.bin", blob)
    assert await a.read_file("d/e/blob.bin") == blob
    assert (await a.exec("stat -c '%u %a' d d/e d/e/blob.bin")).stdout == "1000 755\n" * 2 + (
        "1000 644\n"
    )
    await assert_healthy(a, b)


async def test_swe_editor_cannot_read_through_links(
    pair: tuple[DockerSandbox, DockerSandbox],
) -> None:
    from agentrl.envs.swe.editor import Editor, EditorError
    from agentrl.envs.swe.workspace import SandboxFS

    a, b = pair
    await a.exec("mkdir repo && ln -s / repo/link && echo hi > repo/ok.txt")
    editor = Editor(SandboxFS(a), "/workspace/repo")
    assert "hi" in await editor.run("view", "ok.txt")
    with pytest.raises(EditorError) as err:
        await editor.run("view", "link/etc/shadow")
    assert "root:" not in str(err.value)
    with pytest.raises(EditorError):
        await editor.run("create", "link/tmp/planted.txt", file_text="x")
    assert "planted" not in (await a.exec("ls /tmp")).stdout
    await assert_healthy(a, b)


async def test_a_daemon_holding_a_lock_cannot_switch_off_the_sweep(
    pair: tuple[DockerSandbox, DockerSandbox],
) -> None:
    a, b = pair
    # The old sweep ran only if it got an exclusive flock on "/"; this daemon holds a
    # shared one (and one on /tmp and /workspace) for good.
    daemon = (
        "setsid sh -c 'exec 5</ 6</tmp 7</workspace; flock -s 5; flock -s 6; flock -s 7;"
        " exec sleep 300' >/dev/null 2>&1 </dev/null & sleep 0.3; echo started"
    )
    assert (await a.exec(daemon)).stdout == "started\n"
    await a.exec("setsid sleep 301 >/dev/null 2>&1 </dev/null & echo x")
    assert not [p for p in ps((await a.exec("ps -eo args")).stdout) if "sleep 30" in p]
    await assert_healthy(a, b)


async def test_sweep_spares_execs_still_running(
    pair: tuple[DockerSandbox, DockerSandbox],
) -> None:
    a, b = pair
    # A long exec's own background job lives while it runs, though a short exec ends
    # (and sweeps) meanwhile; execs ending together do not kill each other's shells.
    long = a.exec(
        "setsid sleep 310 >/dev/null 2>&1 </dev/null & sleep 1.5;"
        " ps -eo args | grep -c '^sleep 310'"
    )
    shorts = [a.exec(f"sleep 0.5; echo {i}") for i in range(4)]
    results = await asyncio.gather(long, *shorts)
    assert results[0].stdout == "1\n", results[0]
    assert [r.stdout for r in results[1:]] == [f"{i}\n" for i in range(4)]
    assert all(r.exit_code == 0 for r in results), results
    assert not [p for p in ps((await a.exec("ps -eo args")).stdout) if "sleep 3" in p]
    await assert_healthy(a, b)
