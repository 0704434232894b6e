"""The resident exec server in Docker sandboxes: same results as ``docker exec``, a round
trip instead of an exec, restarted when the code kills it, out of the code's reach, and
``docker exec`` where the image has no python3 or the server is busy."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.sandbox.base import SandboxLimits
from agentrl.sandbox.docker import DockerSandbox
from agentrl.sandbox.local import LocalSandbox
from tests.integration import docker_fixtures
from tests.integration.docker_fixtures import LIMITS

docker_image = docker_fixtures.docker_image  # the session fixture, under its own name

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CASES = [
    dict(cmd="echo out; echo err >&2; exit 3"),
    dict(cmd=["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"], stdin="abc" * 50000),
    dict(cmd="echo $FOO $HOME; pwd; id -u", env={"FOO": "bar"}),
    dict(cmd="head -c 200000 /dev/zero | tr '\\0' x; echo; echo e >&2"),  # past the cap
    dict(cmd="sleep 30", timeout_s=1),
    dict(cmd="kill -TERM $$"),
    dict(cmd=["sh", "-c", 'printf "%s|" "$@"', "x", "a b", "", "ü\n"]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: str(c["cmd"])[:24])
async def test_results_match_docker_exec(docker_image: str, case: dict) -> None:
    kw = {k: v for k, v in case.items() if k != "cmd"}
    limits = SandboxLimits(**{**LIMITS.__dict__, "max_output_bytes": 1000})
    got = {}
    for resident in (True, False):
        async with DockerSandbox(docker_image, limits, resident_exec=resident) as sb:
            r = await sb.exec(case["cmd"], **kw)
            path = "resident" if resident else "docker_exec"
            assert sb.exec_paths[path] == 1 and sum(sb.exec_paths.values()) == 1
            got[resident] = (r.stdout, r.stderr, r.exit_code, r.timed_out)
    assert got[True] == got[False]


async def test_a_command_killed_by_a_signal_has_only_its_own_stderr(docker_image: str) -> None:
    # The wrapper's dash printed "Terminated" into the command's stderr when its `wait`
    # reaped the job (most runs, not all: CI once saw the two exec paths differ). The
    # command wrote nothing, and LocalSandbox says so too.
    cmds = ["kill -TERM $$", "sleep 0.2; kill -TERM $$", "echo e >&2; kill -INT $$"]
    want = {cmds[0]: ("", -15), cmds[1]: ("", -15), cmds[2]: ("e\n", -2)}
    for resident in (True, False):
        async with DockerSandbox(docker_image, LIMITS, resident_exec=resident) as sb:
            for cmd in cmds * 3:
                r = await sb.exec(cmd)
                assert (r.stderr, r.exit_code) == want[cmd], (resident, cmd)
    async with LocalSandbox(LIMITS) as lb:
        for cmd in cmds:
            r = await lb.exec(cmd)
            assert (r.stderr, r.exit_code) == want[cmd], ("local", cmd)


async def test_a_killed_server_is_restarted_and_never_reruns_a_command(docker_image: str) -> None:
    async with DockerSandbox(docker_image, LIMITS) as sb:
        assert (await sb.exec("echo 1 >> runs")).ok
        r = await sb.exec("echo 2 >> runs; kill -9 -1")  # the server dies with the command
        assert r.exit_code == -9 and not r.timed_out
        r = await sb.exec("cat runs")
        assert r.stdout == "1\n2\n"  # the killed command ran once, not again on docker exec
        assert sb._resident is not None and sb._resident.starts == 2
        assert sb.exec_paths == {"resident": 3, "docker_exec": 0}
        await sb.reset()  # kills every uid-1000 process, the server too
        assert (await sb.exec("echo ok")).stdout == "ok\n" and sb._resident.starts == 3


async def test_the_code_cannot_trace_or_read_the_server(docker_image: str) -> None:
    probe = (
        "import ctypes, os\n"
        "def cmd(p): return open(f'/proc/{p}/cmdline', 'rb').read()\n"
        "srv = [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()"
        " and cmd(p).startswith(b'python3\\x00-c')]\n"
        "print(len(srv))\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for p in srv + [str(os.getppid())]:\n"
        "  for f in ('mem', 'environ'):\n"
        "    try: open(f'/proc/{p}/{f}', 'rb').read(1); print('READ', p, f)\n"
        "    except OSError as e: print('denied', p, f)\n"
        "  if p in srv: print('TRACED' if libc.ptrace(16, int(p), 0, 0) == 0 else 'no', p)\n"
    )
    async with DockerSandbox(docker_image, LIMITS) as sb:
        r = await sb.run_code(probe)
        lines = r.stdout.splitlines()
        assert lines[0] == "1", r  # the server is there, as the sandbox user...
        srv = [x for x in lines[1:] if x.split()[1] != lines[-1].split()[1]]
        assert srv and not any(x.startswith(("READ", "TRACED")) for x in srv), r.stdout
        # ...and out of reach, where the code's own (dumpable) parent shell is not.
        assert f"READ {lines[-1].split()[1]} environ" in lines, r.stdout
        assert (await sb.exec("echo still")).stdout == "still\n"


async def test_images_without_python_use_docker_exec(docker_image: str) -> None:
    from agentrl.sandbox.images import ensure_image

    base = ensure_image("base")
    async with DockerSandbox(base, LIMITS) as sb:
        for _ in range(2):
            r = await sb.exec("echo hi; exit 4")
            assert (r.stdout, r.exit_code) == ("hi\n", 4)
        assert sb.exec_paths == {"resident": 0, "docker_exec": 2}
        assert sb._resident is not None and "no exec server" in sb._resident.unavailable
        assert sb._resident.starts == 1  # tried once, not on every call


async def test_concurrent_calls_do_not_wait_for_each_other(docker_image: str) -> None:
    async with DockerSandbox(docker_image, LIMITS) as sb:
        await sb.exec("true")  # the server is up
        t0 = time.perf_counter()
        long = asyncio.create_task(sb.exec("sleep 3; echo long"))
        await asyncio.sleep(0.3)
        short = await asyncio.gather(*(sb.exec(f"echo {i}") for i in range(3)))
        short_s = time.perf_counter() - t0
        assert [r.stdout for r in short] == ["0\n", "1\n", "2\n"]
        assert short_s < 2.5, short_s  # ran beside the long call, on docker exec
        assert (await long).stdout == "long\n"
        assert sb.exec_paths["resident"] >= 2 and sb.exec_paths["docker_exec"] >= 1


@pytest.mark.parametrize("resident", [True, False])
async def test_a_stopped_wrapper_is_killed_at_the_host_deadline(docker_image, resident) -> None:
    """The code stops the shell that waits for it (its in-container `timeout` can then
    not end the call): the host kills every process of the sandbox user at the deadline,
    the call ends as timed out, and the sandbox goes on."""
    async with DockerSandbox(docker_image, LIMITS, resident_exec=resident) as sb:
        t0 = time.perf_counter()
        r = await sb.exec("kill -STOP $(ps -o ppid= -p $PPID); sleep 30", timeout_s=1)
        assert (r.exit_code, r.timed_out) == (-9, True) and time.perf_counter() - t0 < 15
        assert not sb.dead and (await sb.exec("echo on")).stdout == "on\n"
