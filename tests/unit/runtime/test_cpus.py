"""CPU pinning: list syntax, refusals that name the field, and pins that hold in the
processes they are meant for (checked in subprocesses: the test session stays unpinned)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agentrl.errors import UserError
from agentrl.inference.server import ServerConfig, VLLMServer
from agentrl.runtime.cpus import check_cpus, cpu_list

two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs (CI has 2)")


def _python(code: str, timeout_s: float = 60) -> str:
    """Runs ``code`` in a fresh interpreter (so the pins stay out of the test session)."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, check=True
    )
    return out.stdout


def test_cpu_list_uses_the_kernel_syntax() -> None:
    assert cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert cpu_list([3]) == "3"


def test_a_cpu_this_process_cannot_use_is_refused_by_name() -> None:
    with pytest.raises(UserError, match=r"trainer.cpus: CPU\(s\) \[4096\] are not available"):
        check_cpus([0, 4096], "trainer.cpus")
    assert check_cpus([0, 0], "x") == [0]


def test_pin_process_pins_affinity_and_torch_threads() -> None:
    code = (
        "import os, torch\n"
        "from agentrl.runtime.cpus import pin_process\n"
        "pin_process([0])\n"
        "kid = os.popen('grep Cpus_allowed_list /proc/self/status').read().split()[-1]\n"
        "print(sorted(os.sched_getaffinity(0)), torch.get_num_threads(), kid)\n"
    )
    assert _python(code).split() == ["[0]", "1", "0"]  # a child it starts is pinned too


def test_the_reaper_pins_the_server_command() -> None:
    show = "import os; print(sorted(os.sched_getaffinity(0)))"
    out = subprocess.run(
        [sys.executable, "-m", "agentrl.inference.reaper", "--parent", str(os.getpid()),
         "--cpus", "0", "--", sys.executable, "-c", show],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "[0]"


def test_server_pins_go_to_the_reaper_and_vllm_openmp(tmp_path) -> None:
    server = VLLMServer(ServerConfig(model=str(tmp_path), cpus=(0, 1), device="cpu"))
    assert server.environment()["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    cmd = server.launch_command()
    assert cmd[cmd.index("--cpus") + 1] == "0-1" and cmd.index("--cpus") < cmd.index("--")
    unpinned = VLLMServer(ServerConfig(model=str(tmp_path), device="cpu"))
    assert "--cpus" not in unpinned.launch_command()


def test_a_run_refuses_pins_it_cannot_apply_before_starting_anything(tmp_path) -> None:
    from agentrl.config import load_config
    from agentrl.orchestration.startup import prepare

    attached = load_config(None, ['inference.urls=["http://127.0.0.1:9"]', "inference.cpus=[0]"])
    with pytest.raises(UserError, match="pins the servers agentrl launches"):
        prepare(attached, None, print)
    far = load_config(None, [f"output_dir={tmp_path}", "inference.cpus=[4096]"])
    with pytest.raises(UserError, match=r"inference.cpus: CPU\(s\) \[4096\]"):
        prepare(far, None, print)
    assert not list(tmp_path.iterdir())  # no run directory was made


@two_cpus
def test_pinned_thread_runs_calls_on_its_cpus_and_leaves_the_caller_alone() -> None:
    code = (
        "import os, json\n"
        "from agentrl.runtime.cpus import PinnedThread, pin_thread\n"
        "pin_thread([0])\n"
        "t = PinnedThread([1])\n"
        "kid = lambda: os.popen('grep Cpus_allowed_list /proc/self/status').read().split()[-1]\n"
        "inner = t.call(lambda: t.call(os.sched_getaffinity, 0))  # from its own thread\n"
        "try:\n"
        "    t.call(int, 'x')\n"
        "except ValueError as e:\n"
        "    err = str(e)\n"
        "print(json.dumps([sorted(t.call(os.sched_getaffinity, 0)), t.call(kid),\n"
        "                  sorted(os.sched_getaffinity(0)), kid(), sorted(inner), err]))\n"
        "t.close(); t.close()\n"
    )
    worker, worker_kid, main, main_kid, inner, err = json.loads(_python(code))
    assert (worker, worker_kid, inner) == ([1], "1", [1])  # the thread and what it starts
    assert (main, main_kid) == ([0], "0")  # the caller keeps its own CPUs
    assert "invalid literal" in err  # an exception reaches the caller


@two_cpus
def test_rollout_cpus_pin_the_event_loop_thread_and_need_trainer_cpus(tmp_path) -> None:
    from agentrl.config import load_config
    from agentrl.orchestration.startup import prepare

    alone = load_config(None, [f"output_dir={tmp_path}", "rollout.cpus=[0]"])
    with pytest.raises(UserError, match=r"set trainer\.cpus too"):
        prepare(alone, None, print)
    bad = load_config(None, [f"output_dir={tmp_path}", "rollout.cpus=[4096]", "trainer.cpus=[0]"])
    with pytest.raises(UserError, match=r"rollout.cpus: CPU\(s\) \[4096\]"):
        prepare(bad, None, print)
    assert not list(tmp_path.iterdir())  # no run directory was made
    code = (
        "import os, torch\n"
        "from agentrl.config import load_config\n"
        "from agentrl.orchestration.startup import pin_run\n"
        "before = sorted(os.sched_getaffinity(0)), torch.get_num_threads()\n"
        "with pin_run(load_config(None, ['rollout.cpus=[0]', 'trainer.cpus=[0,1]'])):\n"
        "    print(sorted(os.sched_getaffinity(0)), torch.get_num_threads())\n"
        "print((sorted(os.sched_getaffinity(0)), torch.get_num_threads()) == before)\n"
    )
    out = _python(code, timeout_s=120)
    # the event loop's thread on rollout.cpus, torch sized for the trainer's two CPUs, and
    # both given back at the end of the run (the next run may pin elsewhere)
    assert out.split() == ["[0]", "2", "True"]
