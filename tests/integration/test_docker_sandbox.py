"""DockerSandbox behaviour: exec, timeouts, output limits, files, reset, labels, bad input."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agentrl.sandbox.base import Sandbox, SandboxError
from agentrl.sandbox.docker import LABEL, DockerSandbox, owner_labels, reap_orphans
from agentrl.sandbox.images import ImageBuildError, build_image, docker_client
from tests.integration import docker_fixtures
from tests.integration.docker_fixtures import LIMITS, ROOT, ps

docker_image = docker_fixtures.docker_image  # the session fixture, under its own name

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_exec_stdout_stderr_exit_code_env_stdin(docker_image: str) -> None:
    async with DockerSandbox(docker_image, LIMITS) as sb:
        assert isinstance(sb, Sandbox)
        r = await sb.exec("echo out; echo err >&2; pwd; id -u; echo $FOO; exit 3", env={"FOO": "x"})
        assert (r.stdout, r.stderr, r.exit_code) == ("out\n/workspace\n1000\nx\n", "err\n", 3)
        assert not r.ok and not r.timed_out and r.duration_s > 0
        r = await sb.exec(["python3", "-c", "import sys; print(sys.stdin.read().upper())"],
                          stdin="hello")  # fmt: skip
        assert r.ok and r.stdout == "HELLO\n"
        r = await sb.run_code("print(6 * 7)")
        assert r.stdout == "42\n"
        assert (await sb.run_code("echo $((1+1))", language="bash")).stdout == "2\n"
        with pytest.raises(ValueError, match="unknown language"):
            await sb.run_code("x", language="cobol")
        r = await sb.exec("kill -TERM $$")
        assert r.exit_code == -15


async def test_timeout_kills_whole_process_tree(docker_image: str) -> None:
    async with DockerSandbox(docker_image, LIMITS) as sb:
        cmd = "trap '' TERM; (sleep 60 &); sh -c 'sleep 61' & python3 -c 'while True: pass'"
        r = await sb.exec(cmd, timeout_s=1.5)
        assert r.timed_out and r.exit_code == -9
        assert r.duration_s < 5
        left = ps((await sb.exec("ps -eo args")).stdout)
        assert not [p for p in left if "sleep 6" in p or "while True" in p], left


async def test_output_is_cut(docker_image: str) -> None:
    async with DockerSandbox(docker_image, LIMITS) as sb:
        r = await sb.exec("head -c 300000 /dev/zero | tr '\\0' a")
        assert r.ok
        assert r.stdout.startswith("a" * (64 << 10))
        assert "output truncated: 234464 more bytes" in r.stdout


async def test_files_roundtrip_and_confinement(docker_image: str, tmp_path: Path) -> None:
    async with DockerSandbox(docker_image, LIMITS) as sb:
        await sb.write_file("a/b/c.txt", "hello")
        await sb.write_file("bin.dat", bytes(range(256)))
        assert await sb.read_file("a/b/c.txt") == b"hello"
        assert await sb.read_file("/workspace/bin.dat") == bytes(range(256))
        r = await sb.exec("stat -c '%u %a' a a/b a/b/c.txt && cat a/b/c.txt")
        assert r.stdout == "1000 755\n1000 755\n1000 644\nhello"
        for bad in ("../etc/passwd", "/etc/passwd", "a/../../x"):
            with pytest.raises(ValueError, match="outside"):
                await sb.write_file(bad, "x")
            with pytest.raises(ValueError, match="outside"):
                await sb.read_file(bad)
        with pytest.raises(FileNotFoundError):
            await sb.read_file("missing.txt")
        with pytest.raises(ValueError, match="regular file"):
            await sb.read_file("a")
        await sb.exec("ln -s /etc/passwd link")
        with pytest.raises(ValueError, match="regular file"):
            await sb.read_file("link")


async def test_upload_copy_dir_in_download(docker_image: str, tmp_path: Path) -> None:
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "test_mod.py").write_text("from pkg.mod import X\ndef test_x():\n    assert X == 1\n")
    (tmp_path / "one.txt").write_text("one")
    async with DockerSandbox(docker_image, LIMITS) as sb:
        await sb.copy_dir_in(src, "repo")
        await sb.upload(tmp_path / "one.txt")
        await sb.upload(tmp_path / "one.txt", "deep/er/two.txt")
        r = await sb.exec("cd repo && python3 -m pytest -q -p no:cacheprovider 2>&1")
        assert r.ok, r.stdout
        assert (await sb.read_file("one.txt"), await sb.read_file("deep/er/two.txt")) == (
            b"one",
            b"one",
        )
        await sb.exec("mkdir -p out/sub && echo made > out/sub/f.txt && ln -s /etc/shadow out/bad")
        dest = tmp_path / "dl"
        try:
            await sb.download("out/sub", dest)
            assert (dest / "sub" / "f.txt").read_text() == "made\n"
            await sb.download("out", tmp_path / "dl2")
        except Exception as e:  # the data filter refuses the link out; never follows it
            assert "link" in str(e).lower() or "outside" in str(e).lower(), e
        assert not (tmp_path / "dl2" / "out" / "bad").exists()


async def test_reset_kills_processes_and_wipes_files(docker_image: str) -> None:
    async with DockerSandbox(docker_image, LIMITS, kill_background=False) as sb:
        await sb.write_file("f.txt", "x")
        await sb.exec("sleep 300 >/dev/null 2>&1 & echo x > /tmp/t; chmod 000 /tmp/t")
        assert any("sleep 300" in p for p in ps((await sb.exec("ps -eo args")).stdout))
        await sb.reset()
        r = await sb.exec("ls -A /workspace /tmp; ps -eo args")
        assert "f.txt" not in r.stdout and "/tmp/t" not in r.stdout and "sleep 300" not in r.stdout


async def test_close_is_idempotent_and_removes_container(docker_image: str) -> None:
    client = docker_client()
    sb = DockerSandbox(docker_image, LIMITS, labels={"purpose": "test"})
    await sb.start()
    c = client.containers.get(sb.container_id)
    assert c.labels[LABEL] == "1" and c.labels["agentrl.pid"] == str(os.getpid())
    assert c.labels["purpose"] == "test"
    await sb.close()
    await sb.close()
    assert not client.containers.list(all=True, filters={"id": c.id})
    with pytest.raises(SandboxError):
        await sb.exec("true")


def test_reaper_removes_only_orphans(docker_image: str) -> None:
    client = docker_client()
    dead = subprocess.Popen(["true"])
    dead.wait()
    labels = {LABEL: "1", "agentrl.host": os.uname().nodename, "agentrl.pid": str(dead.pid)}
    orphan = client.containers.create(docker_image, ["sleep", "1"], labels=labels)
    mine = client.containers.create(docker_image, ["sleep", "1"], labels=owner_labels())
    try:
        assert reap_orphans(client) >= 1
        assert not client.containers.list(all=True, filters={"id": orphan.id})
    finally:
        mine.remove(force=True)


async def test_bad_image_is_a_clear_error(docker_image: str) -> None:
    with pytest.raises(SandboxError, match="could not start a container from 'agentrl/nope:0'"):
        await DockerSandbox("agentrl/nope:0", LIMITS).start()


def test_failed_build_quotes_log_tail(docker_image: str, tmp_path: Path, monkeypatch) -> None:
    shutil.copytree(ROOT / "sandboxes" / "base", tmp_path / "base")  # same hash: cached
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "Dockerfile").write_text(
        "ARG BASE\nFROM ${BASE}\nRUN echo marker-before-failure && exit 7\n"
    )
    monkeypatch.setenv("AGENTRL_SANDBOXES_DIR", str(tmp_path))
    with pytest.raises(ImageBuildError) as e:
        build_image("broken")
    assert "marker-before-failure" in str(e.value) and "build log tail" in str(e.value)
    assert "returned a non-zero code: 7" in str(e.value)


def test_no_engine_is_a_clear_error(monkeypatch) -> None:
    import agentrl.sandbox.images as images

    images.docker_client.cache_clear()
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    try:
        with pytest.raises(RuntimeError, match=r"setup-docker\.sh"):
            images.docker_client()
    finally:
        images.docker_client.cache_clear()


def test_setup_script_without_root_or_engine_explains() -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root to drop to an unprivileged user")
    proc = subprocess.run(
        ["runuser", "-u", "nobody", "--", "env", "DOCKER_HOST=unix:///nonexistent.sock",
         "PATH=/usr/bin:/bin:/usr/local/bin", "bash", "-s"],
        input=(ROOT / "scripts" / "setup-docker.sh").read_text(),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "is not root" in proc.stderr and "cannot install or start" in proc.stderr


@pytest.mark.parametrize("at", ["before the engine call", "volume made", "container made"])
async def test_a_start_cancelled_midway_leaves_no_container(
    docker_image: str, at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller cancelled while the engine creates its container (an episode cut by its
    budget, a run ending) never holds the sandbox: what the engine call still makes is
    removed, not left running until the process exits."""
    import asyncio
    import threading

    run = f"cancel-{at.split()[0]}"
    client = docker_client()
    reached = threading.Event()
    sb = DockerSandbox(docker_image, LIMITS, run_id=run, client=client)
    if at == "volume made":
        make_volume = sb._volume

        def volume(opts: str):
            vol = make_volume(opts)
            reached.set()
            return vol

        sb._volume = volume  # type: ignore[method-assign]
    elif at == "container made":
        from docker.models.containers import ContainerCollection

        create = ContainerCollection.create

        def create_container(self, *a, **k):
            made = create(self, *a, **k)
            reached.set()
            return made

        monkeypatch.setattr(ContainerCollection, "create", create_container)
    else:
        reached.set()
    task = asyncio.create_task(sb.start())
    assert await asyncio.to_thread(reached.wait, 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    filters = {"label": [f"agentrl.run={run}"]}
    for _ in range(150):  # the engine call finishes in its thread, then removes its work
        left = client.containers.list(all=True, filters=filters)
        left += client.volumes.list(filters=filters)
        if not left:
            break
        await asyncio.sleep(0.2)
    assert not left, f"left behind by the cancelled start: {left}"
    await sb.close()  # idempotent after the cancel
