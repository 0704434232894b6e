"""Fault-injection harness: real ``agentrl train`` subprocesses, their accounting, leaks, records.

Each chaos case drives the real CLI (``python -m agentrl.cli train ...``) in its own
process group, injects one fault, and writes a :class:`ChaosRecord` as JSON under
:func:`results_dir` (``benchmarks/chaos_report.py`` prints them as a table).

Accounting reads what the run left on disk: the task index of every trained group
(``trajectories/step_N.parquet``, group id ``batch:index:task``), the train lines of
``metrics.jsonl`` and the task stream's state in the newest checkpoint (which tasks
were handed out and not yet trained: they are re-issued on resume, so they are not
lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CASE_ENV = "AGENTRL_CHAOS_CASE"
"""Environment variable every process of a case inherits: how its leftovers are found."""


def results_dir() -> Path:
    """Where case records go (``AGENTRL_CHAOS_RESULTS`` or ``<repo>/.chaos/results``)."""
    path = Path(os.environ.get("AGENTRL_CHAOS_RESULTS") or REPO / ".chaos" / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class ChaosRecord:
    """What one fault did to one run."""

    case: str
    mode: str
    outcome: str = "unknown"
    episodes_lost: int | None = None
    duplicated: int | None = None
    steps_lost: int | None = None
    recovery_s: float | None = None
    leaks: list[str] = field(default_factory=list)
    detail: str = ""

    def write(self) -> Path:
        """Writes ``<results>/<case>-<mode>.json`` (replacing an older record of the case)."""
        path = results_dir() / f"{self.case}-{self.mode}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**asdict(self), "time": time.time()}, indent=1))
        os.replace(tmp, path)
        return path


# ----------------------------------------------------------------------------- the run


def overrides(model_dir: Path, url: str | None, out: Path, name: str, **extra: Any) -> list[str]:
    """Small, fast run settings (tiny model, 2 tasks × 2 episodes, short turns)."""
    base: dict[str, Any] = {
        "model.path": str(model_dir),
        "output_dir": str(out),
        "run_name": name,
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 2,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 512,
        "rollout.episode_timeout_s": 120,
        "eval.num_tasks": 2,
        "eval.every": 0,
        "trainer.optim.lr": 1e-3,
        "save_every": 1,
        "wandb": "disabled",
    }
    if url is not None:
        base["inference.urls"] = f'["{url}"]'
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def die_with_parent() -> None:
    """In the child: SIGKILL when the thread that started it exits (PR_SET_PDEATHSIG), so a
    test or soak killed however it ends takes its run along (the run's watchdog then
    removes what the run made)."""
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL, 0, 0, 0)


class TrainProc:
    """``agentrl train`` as a subprocess in its own session, output in ``log``.

    Args:
        args: Arguments after ``agentrl train``.
        run_dir: The run directory it writes (output_dir/run_name).
        case_id: Value of ``AGENTRL_CHAOS_CASE`` in its environment.
        tag: Suffix of the output file's name (a resumed run's own file).
        log_dir: Where the output file goes (default: beside ``run_dir``; elsewhere when
            the run directory's disk is to be filled).
    """

    def __init__(
        self,
        args: list[str],
        run_dir: Path,
        case_id: str,
        tag: str = "",
        log_dir: Path | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.log_path = (log_dir or run_dir.parent) / f"{run_dir.name}{tag}.out"
        env = {**os.environ, CASE_ENV: case_id, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agentrl.cli", "train", *args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=REPO, start_new_session=True, preexec_fn=die_with_parent,
            )  # fmt: skip
        self.pid = self.proc.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def steps(self) -> list[int]:
        return train_steps(self.run_dir)

    def wait_for(self, cond: Any, timeout: float, what: str, poll: float = 0.2) -> float:
        """Waits until ``cond()`` holds; returns the time it took. Fails if the run exits."""
        t0 = time.monotonic()
        while not cond():
            if self.proc.poll() is not None:
                raise AssertionError(f"run exited ({self.proc.returncode}) before {what}:\n"
                                     f"{self.output()[-4000:]}")  # fmt: skip
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"no {what} within {timeout:.0f}s:\n{self.output()[-4000:]}")
            time.sleep(poll)
        return time.monotonic() - t0

    def wait_step(self, step: int, timeout: float = 300.0) -> float:
        return self.wait_for(lambda: step in self.steps(), timeout, f"training step {step}")

    def wait(self, timeout: float = 300.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            tail = self.output()[-4000:]
            raise AssertionError(f"run did not end within {timeout:.0f}s:\n{tail}") from None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signals the agentrl process only (its children must notice on their own)."""
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)
        if sig == signal.SIGKILL:
            self.proc.wait(30)


def train_steps(run_dir: Path) -> list[int]:
    """Steps of the ``train`` lines of metrics.jsonl, in file order (a torn last line skipped)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("kind", "train") == "train":
            out.append(int(m["step"]))
    return out


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    rows = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


# ----------------------------------------------------------------------------- servers


def server_config(
    model_dir: Path, log_dir: Path, *, max_num_seqs: int = 16, max_model_len: int = 1024
) -> Any:
    """A small vLLM-CPU server of the tiny model (``--enforce-eager``: no compile warm-up,
    about a minute less per start and per restart)."""
    from agentrl.inference.server import ServerConfig

    return ServerConfig(
        model=str(model_dir),
        dtype="float32",
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        kv_cache_gib=1,
        startup_timeout_s=420,
        extra_args=("--enforce-eager",),
        log_dir=str(log_dir),
    )


class ServerHandle:
    """The suite's vLLM server, with the faults a case injects (freeze, thaw, kill, restart).

    ``AGENTRL_CHAOS_SERVER=URL,PGID`` reuses a server already running (for iterating
    on the suite); the suite then signals that process group and restarts it on its port.
    """

    def __init__(self, config: Any, url: str | None = None, pgid: int | None = None) -> None:
        from agentrl.inference.server import VLLMServer

        port = int(url.rsplit(":", 1)[1]) if url else None
        self.server = VLLMServer(config, port)
        self.url = self.server.url
        self._pgid = pgid

    @property
    def pgid(self) -> int:
        pid = self.server.pid or self._pgid
        assert pid is not None, "the server is not running"
        return pid

    def start(self) -> float:
        """Starts it on its port; returns the seconds it took."""
        t0 = time.monotonic()
        asyncio.run(self.server.start())
        self._pgid = None
        return time.monotonic() - t0

    def freeze(self) -> None:
        os.killpg(self.pgid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self.pgid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILLs the server's processes, as a crash or the OOM killer would; its reaper
        (agentrl's watchdog of the group) outlives them, as it would then."""
        from agentrl.inference.reaper import kill_members

        pgid = self.pgid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGCONT)
        if self.server.pid is not None:
            self.server.kill()
        else:
            kill_members(pgid)
        self._pgid = None
        deadline = time.monotonic() + 30
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)

    def stop(self) -> None:
        if self.server.pid is not None:
            asyncio.run(self.server.stop())


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# ----------------------------------------------------------------------------- accounting


@dataclass
class Accounting:
    """Tasks trained, per step, against the task stream's own record."""

    per_step: dict[int, list[int]]
    issued: int
    outstanding: list[int]
    discarded_groups: int

    @property
    def trained(self) -> Counter[int]:
        return Counter(i for idx in self.per_step.values() for i in idx)

    @property
    def duplicated(self) -> int:
        """Task indices trained in more than one group (each extra time counts)."""
        return sum(n - 1 for n in self.trained.values() if n > 1)

    @property
    def lost(self) -> int:
        """Issued tasks neither trained, nor waiting to be re-issued, nor counted as discarded."""
        missing = set(range(self.issued)) - set(self.trained) - set(self.outstanding)
        return max(0, len(missing) - self.discarded_groups)


def step_indices(run_dir: Path) -> dict[int, list[int]]:
    """Task index of every trained group, per step file."""
    from agentrl.reporting.run_dir import read_trajectories

    out: dict[int, list[int]] = {}
    for path in sorted((run_dir / "trajectories").glob("step_*.parquet")):
        step = int(path.stem.split("_")[1])
        groups = {t.group_id for t in read_trajectories(path)}
        out[step] = sorted(int(g.split(":")[1]) for g in groups)
    return out


def checkpoint_state(run_dir: Path) -> dict[str, Any]:
    """The run state (step, task stream) kept in the checkpoint ``latest`` names."""
    import torch

    from agentrl.trainer.engine.checkpoint import resolve_checkpoint

    ckpt = resolve_checkpoint(run_dir / "checkpoints")
    state = torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=False)
    return dict(state["extra"].get("run", {}))


def account(run_dir: Path) -> Accounting:
    per_step = step_indices(run_dir)
    state = checkpoint_state(run_dir)
    stream = state.get("stream", {})
    # Groups dropped as untrainable are counted in the step's metrics, not in its file.
    last: dict[int, dict[str, Any]] = {}
    for m in metrics(run_dir):
        if m.get("kind", "train") == "train":
            last[int(m["step"])] = m
    discarded = sum(
        int(v) for m in last.values() for k, v in m.items() if k.startswith("discard/group:")
    )
    return Accounting(
        per_step=per_step,
        issued=int(stream.get("next", 0)),
        outstanding=[int(i) for i in stream.get("outstanding", [])],
        discarded_groups=discarded,
    )


# ----------------------------------------------------------------------------- disks


def fill_disk(path: Path, leave_bytes: int) -> Path:
    """Fills the filesystem of ``path`` up to ``leave_bytes`` free."""
    filler = path / "filler.bin"
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        f.truncate(0)
        chunk = b"\0" * (1 << 20)
        todo = free - leave_bytes
        while todo > 0:
            f.write(chunk[: min(len(chunk), todo)])
            todo -= len(chunk)
        f.flush()
    return filler


def says_disk_full(out: str) -> bool:
    """One clear message naming the cause, no traceback."""
    low = out.lower()
    return ("disk full" in low or "no space left" in low) and "Traceback" not in out


# ----------------------------------------------------------------------------- leaks


def case_pids(case_id: str) -> list[int]:
    """Live processes whose environment carries this case's marker."""
    needle = f"{CASE_ENV}={case_id}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes()
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if needle in env.split(b"\0") and ") Z " not in stat:
            out.append(int(name))
    return out


def _describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        cmd = "?"
    return f"process {pid}: {cmd}"


def _sandbox_owned(kind: str, pids: set[int]) -> list[str]:
    """Sandbox ``kind`` ("container" or "volume": a container's tmpfs scratch) owned by
    ``pids``, each as ``"KIND ID (owner pid PID)"``."""
    ls, key = (["ps", "-a"], "{{.ID}}") if kind == "container" else (["volume", "ls"], "{{.Name}}")
    try:
        r = subprocess.run(
            ["docker", *ls, "--filter", "label=agentrl.sandbox=1",
             "--format", key + " {{.Label \"agentrl.pid\"}}"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    out = []
    for line in r.stdout.splitlines():
        name, _, pid = line.partition(" ")
        if pid.isdigit() and int(pid) in pids:
            out.append(f"{kind} {name} (owner pid {pid})")
    return out


@dataclass
class LeakWatch:
    """Finds what a case left behind: processes, containers and their volumes, /dev/shm
    entries."""

    case_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    shm_before: set[str] = field(default_factory=lambda: set(os.listdir("/dev/shm")))
    owners: set[int] = field(default_factory=set)

    def own(self, pid: int) -> None:
        """Records an agentrl process of the case (its containers carry its pid)."""
        self.owners.add(pid)

    def leaks(self, wait_s: float = 20.0) -> list[str]:
        """What is still there after up to ``wait_s`` seconds (watchdogs get time to act)."""
        deadline = time.monotonic() + wait_s
        while True:
            found = [_describe(p) for p in case_pids(self.case_id)]
            found += _sandbox_owned("container", self.owners)
            found += _sandbox_owned("volume", self.owners)
            new = set(os.listdir("/dev/shm")) - self.shm_before
            found += [f"/dev/shm/{n}" for n in sorted(new) if n.startswith("agentrl")]
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(1.0)

    def clean(self) -> None:
        """Kills and removes whatever :meth:`leaks` finds, so one case cannot spoil the next."""
        for pid in case_pids(self.case_id):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for c in _sandbox_owned("container", self.owners):
            subprocess.run(["docker", "rm", "-f", c.split()[1]], capture_output=True, timeout=60)
        for v in _sandbox_owned("volume", self.owners):
            subprocess.run(["docker", "volume", "rm", "-f", v.split()[1]], capture_output=True,
                           timeout=60)  # fmt: skip
        for n in set(os.listdir("/dev/shm")) - self.shm_before:
            if n.startswith("agentrl"):
                import shutil

                shutil.rmtree(f"/dev/shm/{n}", ignore_errors=True)
