"""The trainer in a process of its own (``trainer.worker=process``): the same update as
in-process, weights handed over as safetensors directories, errors that keep their type,
a dead child named, and nothing left behind however the run ends.

Each test starts real child processes (``python -m agentrl.orchestration.trainer_process``);
one is shared by the tests that only call it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.orchestration.trainer_process import (
    ProcessTrainer,
    TrainerProcessError,
    _child_env,
    for_trainer,
)
from agentrl.runtime.cpus import pinned
from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.engine.checkpoint import CheckpointError
from agentrl.trainer.engine.sysmem import find_jemalloc
from tests.helpers.trainer import random_batch, tiny_model_dir
from tests.leak_check import alive

torch.set_num_threads(2)

CFG = TrainerConfig(seed=1)


def _start(model: Path, cfg: TrainerConfig = CFG, **kw: object) -> ProcessTrainer:
    return asyncio.run(ProcessTrainer.start(cfg, str(model), **kw))  # type: ignore[arg-type]


def _gone(pid: int, within_s: float) -> bool:
    """``pid`` has exited (or is a zombie) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def proc(model: Path) -> Iterator[ProcessTrainer]:
    t = _start(model)
    yield t
    t.close()


def _with_unpicklable_info(n: int) -> list:
    trajs = random_batch(n)
    for t in trajs:  # what an env may put in an episode's info: it never reaches the trainer
        t.info = {"lock": threading.Lock()}
        t.messages = [{"role": "user", "content": "hi"}]  # type: ignore[list-item]
    return trajs


def test_a_step_in_the_child_is_the_step_in_process(model: Path) -> None:
    """Same weights, same batch: the same metrics and the same new weights, which come back
    as a safetensors directory the servers load as is."""
    here = Trainer(CFG, str(model))
    child = _start(model)
    try:
        trajs = _with_unpicklable_info(8)
        m_here = here.step([for_trainer(t) for t in trajs])
        m_child = child.step(trajs)
        assert m_child["actor/grad_norm"] == pytest.approx(m_here["actor/grad_norm"], rel=1e-6)
        assert m_child.keys() == m_here.keys()
        snap = child.state_dict_for_inference()
        assert snap.parent == child.weights_dir
        got = load_file(str(snap / "model.safetensors"))
        want = here.state_dict_for_inference()
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], atol=1e-6, rtol=0)
    finally:
        child.close()


def test_the_child_saves_and_hands_over_its_lora_adapter(model: Path, tmp_path: Path) -> None:
    """trainer.worker=process with trainer.lora: save_adapter and the adapter's state come
    from the child's trainer, equal to an in-process trainer's after the same step."""
    cfg = TrainerConfig(seed=1, optim={"lr": 1e-2}, lora={"rank": 4})
    here = Trainer(cfg, str(model))
    child = _start(model, cfg)
    try:
        trajs = random_batch(6)
        here.step(trajs)
        child.step(trajs)
        got, want = child.adapter_state_for_inference(), here.adapter_state_for_inference()
        assert got.keys() == want.keys() and all("lora_" in k for k in got)
        for k in want:
            torch.testing.assert_close(got[k], want[k], atol=1e-6, rtol=0)
        out = child.save_adapter(tmp_path / "adapter")
        assert out == tmp_path / "adapter"
        saved = load_file(str(out / "adapter_model.safetensors"))
        assert saved.keys() == want.keys()
        assert (out / "adapter_config.json").is_file()
    finally:
        child.close()


def test_for_trainer_keeps_the_token_fields_and_drops_the_records() -> None:
    t = _with_unpicklable_info(1)[0]
    t.tool_calls = [{"name": "python"}]
    t.error = "boom"
    s = for_trainer(t)
    assert (s.token_ids, s.loss_mask, s.rollout_logprobs) == (
        t.token_ids, t.loss_mask, t.rollout_logprobs,
    )  # fmt: skip
    assert (s.spans, s.reward, s.group_id, s.weight_versions) == (
        t.spans, t.reward, t.group_id, t.weight_versions,
    )  # fmt: skip
    assert (s.messages, s.info, s.tool_calls, s.error) == ([], {}, [], None)
    assert t.info and t.messages and t.error == "boom"  # the caller's copy is untouched


def test_the_last_two_snapshots_stay_and_older_ones_go(proc: ProcessTrainer) -> None:
    paths = [proc.state_dict_for_inference() for _ in range(4)]
    assert len(set(paths)) == 4
    assert [p.is_dir() for p in paths] == [False, False, True, True]
    assert sorted(proc.weights_dir.iterdir()) == paths[2:]


def test_an_error_in_the_child_keeps_its_type_and_the_child_lives_on(
    proc: ProcessTrainer, tmp_path: Path
) -> None:
    with pytest.raises(CheckpointError) as e:
        proc.load_checkpoint(tmp_path / "nowhere")
    assert any("trainer process" in n for n in getattr(e.value, "__notes__", []))
    assert proc.step(random_batch(4))["actor/grad_norm"] > 0  # still serving


def test_a_trainer_that_cannot_be_built_stops_the_start_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    with pytest.raises(OSError):  # transformers' own error for a missing model directory
        _start(tmp_path / "no-model", shm_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # the weight directory was removed


def test_a_killed_child_fails_the_call_with_how_it_ended(model: Path, tmp_path: Path) -> None:
    t = _start(model, shm_dir=str(tmp_path))
    os.kill(t.pid, signal.SIGKILL)
    with pytest.raises(TrainerProcessError, match=r"died during step \(killed by SIGKILL .*OOM"):
        t.step(random_batch(4))
    t.close()
    t.close()  # idempotent
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TrainerProcessError, match="after close"):
        t.state_dict_for_inference()


def test_close_stops_the_child_and_removes_its_weights(model: Path) -> None:
    t = _start(model)
    t.state_dict_for_inference()
    assert t.weights_dir.is_dir()
    t.close()
    assert _gone(t.pid, 0.1)  # close() waited for it
    assert not t.weights_dir.exists()


_PARENT = """
import asyncio, sys
from agentrl.orchestration.trainer_process import ProcessTrainer
from agentrl.trainer import TrainerConfig
t = asyncio.run(ProcessTrainer.start(TrainerConfig(), sys.argv[1]))
t.state_dict_for_inference()
print(t.pid, t.weights_dir, flush=True)
sys.stdin.read()
"""


def test_a_sigkilled_run_takes_its_trainer_process_and_weights_with_it(model: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(model)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert parent.stdout is not None
        pid_s, weights = parent.stdout.readline().split()
        child = int(pid_s)
        assert not _gone(child, 0.3) and Path(weights).is_dir()
        parent.kill()
        parent.wait()
        assert _gone(child, 3.0), "the trainer process outlived its run"
        deadline = time.monotonic() + 5.0
        while Path(weights).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(weights).exists(), "the weight directory outlived its run"
    finally:
        parent.kill()
        parent.wait()


_ORPHANING_PARENT = """
import os, socket, subprocess, sys, time
ours, theirs = socket.socketpair()
# Another process holds our end open, so the child never reads EOF: only its watch on
# its parent can end it.
keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                          pass_fds=[ours.fileno()])
child = subprocess.Popen(
    [sys.executable, "-m", "agentrl.orchestration.trainer_process",
     "--fd", str(theirs.fileno()), "--parent", str(os.getpid())],
    pass_fds=[theirs.fileno()])
print(child.pid, keeper.pid, flush=True)
time.sleep(120)
"""


def test_a_trainer_process_whose_run_died_mid_call_exits_on_its_own() -> None:
    """The run is SIGKILLed while its socket stays open elsewhere (as during a long call,
    when the child is not reading it): the child notices its parent is gone."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHANING_PARENT], stdout=subprocess.PIPE, text=True
    )
    keeper = None
    try:
        assert parent.stdout is not None
        child, keeper = map(int, parent.stdout.readline().split())
        time.sleep(3.0)  # the child has imported its module and started watching
        assert not _gone(child, 0.1)
        parent.kill()
        parent.wait()
        assert _gone(child, 10.0), "the trainer process outlived its run"
        assert not _gone(keeper, 0.1)  # its socket was still open all along
    finally:
        parent.kill()
        parent.wait()
        if keeper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(keeper, signal.SIGKILL)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs (CI has 2)")
def test_the_child_computes_on_trainer_cpus_though_the_loop_is_pinned_elsewhere(
    model: Path,
) -> None:
    """Started from an event loop pinned to CPU 0 (rollout.cpus), the child inherits CPU 0,
    then moves to trainer.cpus."""
    with pinned([0], "rollout.cpus"):
        t = _start(model, TrainerConfig(cpus=[1]))
    try:
        assert os.sched_getaffinity(t.pid) == {1}
    finally:
        t.close()


def test_the_child_runs_on_jemalloc(proc: ProcessTrainer, monkeypatch: pytest.MonkeyPatch) -> None:
    """glibc's allocator lets the trainer's RSS creep up step after step; the child gets
    jemalloc preloaded (Ray ships one; `make test` installs Ray)."""
    lib = find_jemalloc()
    assert lib is not None and "libjemalloc.so" in lib
    maps = Path(f"/proc/{proc.pid}/maps").read_text()
    assert os.path.realpath(lib) in maps
    monkeypatch.setenv("AGENTRL_JEMALLOC", "0")
    monkeypatch.setenv("LD_PRELOAD", "")
    assert not _child_env()["LD_PRELOAD"]
    monkeypatch.setenv("AGENTRL_JEMALLOC", "/opt/libjemalloc.so.2")
    monkeypatch.setenv("LD_PRELOAD", "libother.so")
    assert _child_env()["LD_PRELOAD"] == "/opt/libjemalloc.so.2 libother.so"
