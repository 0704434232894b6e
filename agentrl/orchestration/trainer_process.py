"""The run's trainer in a process of its own (``trainer.worker=process``).

On a thread (:class:`~agentrl.orchestration.trainer_thread.ThreadedTrainer`) the trainer
shares the training process's GIL with the event loop that drives the rollouts: in
``fully_async`` on 2 cores its Python work waited for that lock for 4–8% of each step.
Here the trainer is built and stepped in a child process (``python -m
agentrl.orchestration.trainer_process``), pinned to ``trainer.cpus``, that answers one
call at a time over a socket pair. The five calls a run makes of its trainer are
forwarded; only the token-level fields of the trajectories travel (the trainer never reads
an episode's messages, env info or tool records). The weights for the servers do not
travel at all: the child writes them as safetensors into a directory in ``/dev/shm``
that the parent owns, and :meth:`ProcessTrainer.state_dict_for_inference` returns that
directory, which :meth:`~agentrl.inference.weight_sync.WeightSync.push` loads as is.

Lifecycle: :meth:`ProcessTrainer.start` returns once the child has built the trainer;
:meth:`ProcessTrainer.close` (idempotent) stops it and removes the weight directory. The
child ignores SIGINT (the run's Ctrl-C goes to the parent, which closes it) and exits on
its own within a quarter of a second when its parent is gone, however the parent died;
the parent's watchdog removes the weight directory then. A child that dies (e.g. killed
for memory) fails the call in flight with :class:`TrainerProcessError`, which names how
it ended. The child runs with jemalloc preloaded when one is found (Ray's, or the
system's; :func:`~agentrl.trainer.engine.sysmem.find_jemalloc`): glibc's allocator lets
its resident size creep up step after step. A trainer on a thread cannot be preloaded.

Example (builds a real trainer in a child process; slow, so not run as a doctest)::

    trainer = await ProcessTrainer.start(cfg.trainer, model_dir, max_seq_len=2048)
    try:
        metrics = await asyncio.to_thread(trainer.step, trajectories)
        await fleet.sync_weights(await asyncio.to_thread(trainer.state_dict_for_inference))
    finally:
        trainer.close()
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from agentrl.inference.weight_sync import new_weights_dir, remove_weights_dir
from agentrl.orchestration.startup import ComponentError
from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.engine.sysmem import find_jemalloc
from agentrl.types import Trajectory

__all__ = ["ProcessTrainer", "TrainerProcessError", "for_trainer"]

_PARENT_POLL_S = 0.25
_CLOSE_WAIT_S = 10.0
_SNAPSHOTS_KEPT = 2


class TrainerProcessError(ComponentError):
    """The trainer's process could not start, or died; the message says how it ended."""


def for_trainer(t: Trajectory) -> Trajectory:
    """``t`` without what only people and logs read (messages, env info, tool records, the
    error text): what the trainer's process is sent. The token-level fields are the same
    objects."""
    return dataclasses.replace(t, messages=[], info={}, tool_calls=[], error=None)


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (the kernel's OOM killer sends it when memory runs out)" if code == -9 else ""
        return f"killed by {name}{hint}"
    return f"exit status {code}"


class ProcessTrainer:
    """Forwards a run's trainer calls to a child process that owns the trainer.

    Calls block the caller (the driver makes them with ``asyncio.to_thread``) and run one
    at a time, in the order they came.

    Use :meth:`start` to make one.
    """

    def __init__(self, proc: subprocess.Popen[bytes], conn: Connection, weights_dir: Path):
        self._proc = proc
        self._conn = conn
        self.weights_dir = weights_dir
        self._lock = threading.Lock()  # held for the whole of a call
        self._closed = False

    @classmethod
    async def start(
        cls,
        config: TrainerConfig,
        model_dir: str,
        *,
        max_seq_len: int | None = None,
        shm_dir: str | None = None,
    ) -> ProcessTrainer:
        """Starts the child, which pins itself to ``config.cpus`` and builds the trainer.

        Args:
            config: The trainer's config.
            model_dir: The policy's HF model directory.
            max_seq_len: As :class:`~agentrl.trainer.Trainer`'s.
            shm_dir: Where the weight directory goes (default ``/dev/shm`` when it exists).

        Raises:
            TrainerProcessError: The child died before the trainer was built.
            Exception: What building the trainer raised in the child (its own type).
        """
        # Started from the event loop's thread: the child inherits its CPUs, then pins
        # itself to trainer.cpus.
        self = cls(*_spawn(shm_dir))
        try:
            init = (config, model_dir, max_seq_len, str(self.weights_dir))
            await asyncio.to_thread(self._call, "__init__", init, {})
        except BaseException:
            self.close()
            raise
        return self

    # ------------------------------------------------------------------ the trainer's calls

    def step(self, trajectories: list[Trajectory], **kwargs: Any) -> dict[str, float]:
        return self._call("step", ([for_trainer(t) for t in trajectories],), kwargs)

    def state_dict_for_inference(self) -> Path:
        """The current weights, written by the child as safetensors with HF names: a
        directory that :meth:`WeightSync.push` loads as it is.

        The last two stay on disk (the servers may still be loading the one before, and a
        recovering server reloads the last one pushed); older ones are removed.
        """
        return Path(self._call("snapshot", (), {}))

    def save_checkpoint(
        self, root: str | Path | None = None, extra: dict[str, Any] | None = None
    ) -> Path:
        return Path(self._call("save_checkpoint", (root,), {"extra": extra}))

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        return dict(self._call("load_checkpoint", (path,), {}))

    def save_hf(self, out_dir: str | Path) -> Path:
        return Path(self._call("save_hf", (out_dir,), {}))

    def save_adapter(self, out_dir: str | Path) -> Path:
        """The child writes its LoRA adapter to ``out_dir`` (see ``Trainer.save_adapter``)."""
        return Path(self._call("save_adapter", (out_dir,), {}))

    def adapter_state_for_inference(self) -> dict[str, Any]:
        """The child's LoRA adapter on CPU (see ``Trainer.adapter_state_for_inference``);
        it crosses as safetensors bytes (megabytes), not as shared-memory tensors."""
        from safetensors.torch import load

        return load(self._call("adapter_state", (), {}))

    # ------------------------------------------------------------------------- plumbing

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self._lock:
            if self._closed:
                raise TrainerProcessError(f"trainer process: {name} after close()")
            try:
                self._conn.send((name, args, kwargs))
                status, value, tb = self._conn.recv()
            except (EOFError, OSError) as e:
                what = "start-up" if name == "__init__" else name
                raise TrainerProcessError(
                    f"the trainer process died during {what} ({self._ended()})"
                ) from e
        if status == "ok":
            return value
        if isinstance(value, BaseException):
            value.add_note(f"(raised in the trainer process)\n{tb}")
            raise value
        raise TrainerProcessError(f"trainer process, {name}: {value}\n{tb}")

    def _ended(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=2.0)
        return _exit_reason(self._proc.returncode)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self._proc.pid

    def close(self) -> None:
        """Stops the child and removes the weight directory. Idempotent.

        An idle child is asked to exit (and killed if it has not within 10 s); a child in
        the middle of a call (the run was interrupted) is killed at once.
        """
        if self._closed:
            return
        self._closed = True
        if self._lock.acquire(blocking=False):  # idle
            try:
                with contextlib.suppress(OSError, ValueError):
                    self._conn.send(("__exit__", (), {}))
            finally:
                self._lock.release()
            try:
                self._proc.wait(timeout=_CLOSE_WAIT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        else:
            self._proc.kill()
        self._proc.wait()
        self._conn.close()
        remove_weights_dir(self.weights_dir)


def _child_env() -> dict[str, str]:
    """Our environment, with jemalloc added to ``LD_PRELOAD`` when one is found."""
    env = dict(os.environ)
    lib = find_jemalloc()
    if lib is not None and lib not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = " ".join(x for x in (lib, env.get("LD_PRELOAD", "")) if x)
    return env


def _spawn(shm_dir: str | None) -> tuple[subprocess.Popen[bytes], Connection, Path]:
    """Makes the weight directory (watched) and starts the child with one end of a socket
    pair; returns the child, our end and the directory."""
    weights_dir = new_weights_dir("agentrl-trainer-weights-", shm_dir)
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentrl.orchestration.trainer_process",
             "--fd", str(theirs.fileno()), "--parent", str(os.getpid())],
            pass_fds=[theirs.fileno()],
            env=_child_env(),
        )  # fmt: skip
    except BaseException:
        ours.close()
        remove_weights_dir(weights_dir)
        raise
    finally:
        theirs.close()
    return proc, Connection(ours.detach()), weights_dir


# --------------------------------------------------------------------------- the child side


_FORWARDED = frozenset(
    {"step", "save_checkpoint", "load_checkpoint", "save_hf", "save_adapter"}
)  # fmt: skip
"""The Trainer methods the child runs as they are (the weights go by ``snapshot``)."""


class _Child:
    """What the child runs: the trainer, and the weight snapshots it writes."""

    def __init__(self, init: tuple[Any, ...]) -> None:
        import torch

        from agentrl.runtime.cpus import pin_thread
        from agentrl.trainer import Trainer

        config, model_dir, max_seq_len, weights_dir = init
        if config.cpus:  # checked by the run; this process inherited the event loop's CPUs
            pin_thread(config.cpus)
            torch.set_num_threads(len(config.cpus))
        self.trainer = Trainer(config, model_dir, max_seq_len=max_seq_len)
        self.weights_dir = Path(weights_dir)
        self.snapshots: list[Path] = []

    def snapshot(self) -> str:
        from agentrl.inference.weight_sync import write_safetensors

        n = int(self.snapshots[-1].name[1:]) + 1 if self.snapshots else 0
        path = self.weights_dir / f"s{n}"
        write_safetensors(self.trainer.state_dict_for_inference(), path)
        self.snapshots.append(path)
        while len(self.snapshots) > _SNAPSHOTS_KEPT:
            shutil.rmtree(self.snapshots.pop(0), ignore_errors=True)
        return str(path)

    def handle(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name == "snapshot":
            return self.snapshot()
        if name == "adapter_state":
            from safetensors.torch import save

            return save(self.trainer.adapter_state_for_inference())
        if name in _FORWARDED:
            return getattr(self.trainer, name)(*args, **kwargs)
        raise ValueError(f"unknown trainer call {name!r}")


def _picklable(e: BaseException) -> BaseException | str:
    """``e`` if it survives pickling (with its own type), else its text."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return f"{type(e).__name__}: {e}"


def _watch_parent(parent: int) -> None:
    """Ends this process once ``parent`` is gone (its pid is no longer our parent's)."""
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_S)
    os._exit(1)


def _serve(conn: Connection) -> None:
    child: _Child | None = None
    while True:
        try:
            name, args, kwargs = conn.recv()
        except EOFError:  # the parent closed its end
            return
        if name == "__exit__":
            return
        try:
            if name == "__init__":
                child = _Child(args)
                value: Any = None
            elif child is None:
                raise RuntimeError(f"trainer call {name!r} before the trainer was built")
            else:
                value = child.handle(name, args, kwargs)
            reply: tuple[str, Any, str] = ("ok", value, "")
        except Exception as e:
            reply = ("err", _picklable(e), traceback.format_exc())
        conn.send(reply)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="agentrl's trainer process (started by a run).")
    p.add_argument("--fd", type=int, required=True, help="This end of the socket pair.")
    p.add_argument("--parent", type=int, required=True, help="The run's pid.")
    a = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run's Ctrl-C is the parent's to handle
    threading.Thread(target=_watch_parent, args=(a.parent,), daemon=True).start()
    _serve(Connection(a.fd))


if __name__ == "__main__":
    main()
