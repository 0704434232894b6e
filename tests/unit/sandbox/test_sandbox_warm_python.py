"""LocalSandbox's warm Python: ``python3 -c`` forks an interpreter already started in the sandbox.

Each program runs twice in one sandbox: warm (the sandbox's own environment) and cold (one
extra variable, so the helper execs a fresh ``python3``); what the program prints, to
which stream, and its exit status must be the same. ``sys.flags.no_user_site`` tells the
paths apart (the warm interpreter runs with ``-s``).
"""

from __future__ import annotations

import pytest

from agentrl.sandbox import LocalSandbox
from tests.helpers.sandbox import LIMITS, assert_host_healthy, namespaces_work

pytestmark = pytest.mark.skipif(
    not namespaces_work(), reason="LocalSandbox needs root, util-linux unshare and namespaces"
)

COLD = {"AGENTRL_TEST_COLD": "1"}
WHICH = "import sys; print(sys.flags.no_user_site)"

PROGRAMS = {
    "streams": "import sys; print('out'); print('err', file=sys.stderr)",
    "exception": "x = 1\n1 / 0",
    "exit code": "import sys; sys.exit(3)",
    "exit message": "import sys; sys.exit('bye')",
    "syntax error": "1 +",
    "stdin": "import sys; print(sys.stdin.read().upper())",
    "atexit": "import atexit; atexit.register(lambda: print('bye'))\nprint('main')",
    "thread joined at exit": (
        "import threading, time\ndef f():\n    time.sleep(0.05); print('thread')\n"
        "threading.Thread(target=f).start(); print('main')"
    ),
    "argv, path, main": (
        "import sys; print(sys.argv, sys.path[0] == '', __name__, sys.orig_argv[1:],"
        " sorted(k for k in globals() if not k.startswith('__')))"
    ),
    "modules of a fresh interpreter": "import sys; print(sorted(sys.modules))",
    "a local module shadows the stdlib": (
        "open('json.py', 'w').write('X = 1'); import json; print(json.X)"
    ),
    "os._exit": "import os; print('x', flush=True); os._exit(5)",
    "unflushed output": "import sys; sys.stdout.write('partial')",
    "recursion limit": "def f(): f()\nf()",
    "excepthook": (
        "import sys\nsys.excepthook = lambda *a: print('hooked', a[0].__name__)\nraise ValueError"
    ),
    "KeyboardInterrupt": "raise KeyboardInterrupt",
    "stdio setup": (
        "import sys; print([(s.encoding, s.errors, s.line_buffering, s.write_through)"
        " for s in (sys.stdin, sys.stdout, sys.stderr)])"
    ),
    "unprivileged": "import os; print(os.getuid() != 0, os.getgid() != 0, os.getcwd())",
}


async def test_warm_python_runs_code_as_a_fresh_interpreter_would() -> None:
    async with LocalSandbox(LIMITS) as sb:
        assert (await sb.run_code(WHICH)).stdout == "1\n"  # warm
        assert (await sb.exec(["python3", "-c", WHICH], env=COLD)).stdout == "0\n"  # cold
        for name, code in PROGRAMS.items():
            stdin = "abc" if name == "stdin" else None
            warm = await sb.exec(["python3", "-c", code], stdin=stdin)
            cold = await sb.exec(["python3", "-c", code], stdin=stdin, env=COLD)
            assert (warm.stdout, warm.stderr, warm.exit_code) == (
                cold.stdout, cold.stderr, cold.exit_code,
            ), name  # fmt: skip
        await assert_host_healthy(sb)


async def test_warm_python_code_is_contained_and_changes_nothing_for_the_next_call() -> None:
    async with LocalSandbox(LIMITS) as sb:
        status = "print(open('/proc/self/status').read())"
        r = await sb.run_code(status)
        fields = dict(line.split(":\t", 1) for line in r.stdout.splitlines() if ":\t" in line)
        assert fields["CapEff"].strip() == fields["CapBnd"].strip() == "0" * 16
        assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2"
        assert fields["Uid"].split()[0] == str(sb.uid)
        # The helper (pid 1, root) cannot be signalled, traced or read by the code.
        r = await sb.run_code(
            "import os\n"
            "for f in (lambda: os.kill(1, 9), lambda: open('/proc/1/mem', 'rb'),"
            " lambda: os.listdir('/proc/1/fd')):\n"
            "    try:\n        f(); print('reached')\n"
            "    except OSError as e:\n        print(type(e).__name__)"
        )
        assert "reached" not in r.stdout and len(r.stdout.split()) == 3
        # Tampering with its own interpreter, environment and files stays in that call.
        await sb.run_code(
            "import builtins, os, sys, json\n"
            "builtins.print = None; json.dumps = None; os.environ['PATH'] = '/nowhere'\n"
            "sys.modules['os'] = None"
        )
        r = await sb.run_code("import json, os; print(json.dumps([1]), os.environ['PATH'])")
        assert r.ok and r.stdout == "[1] /usr/local/bin:/usr/bin:/bin\n"
        r = await sb.run_code("import os, time\nif os.fork() == 0:\n    time.sleep(60)")
        assert r.ok
        await assert_host_healthy(sb)  # the forked sleeper did not outlive the call
        assert (await sb.run_code(WHICH)).stdout == "1\n"  # still warm


@pytest.mark.parametrize("env", [{"PYTHONPATH": "/workspace"}, {"LD_PRELOAD": "/tmp/x.so"}])
async def test_no_warm_python_when_the_env_would_make_root_load_other_code(env) -> None:
    async with LocalSandbox(LIMITS, env=env) as sb:
        r = await sb.run_code(WHICH)
        assert r.stdout == "0\n"  # a fresh python3 per call
