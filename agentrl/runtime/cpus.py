"""CPU pinning: the inference servers, the trainer and the rollout side on disjoint CPU sets.

On a CPU-only machine the vLLM server and the trainer otherwise share every core, and
overlapping generation with training (``orchestration.mode`` one_step_off/fully_async)
buys nothing. ``inference.cpus=[0]`` and ``trainer.cpus=[1]`` give each side its own;
``rollout.cpus`` moves the rollout side of the training process (its event loop, the envs
and the local sandboxes it starts) off the trainer's CPUs, the trainer then computing on
a thread of its own (:class:`PinnedThread`).

Example:
    >>> from agentrl.runtime.cpus import check_cpus
    >>> check_cpus([0], "trainer.cpus")
    [0]
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from agentrl.errors import UserError

__all__ = ["PinnedThread", "check_cpus", "cpu_list", "pin_process", "pin_thread", "pinned"]

T = TypeVar("T")


def check_cpus(cpus: Sequence[int], field: str) -> list[int]:
    """``cpus`` sorted, if this process may run on every one of them.

    Raises:
        UserError: A CPU this process may not use (naming ``field`` and the allowed set).
    """
    allowed = os.sched_getaffinity(0)
    bad = sorted(set(cpus) - allowed)
    if bad:
        raise UserError(
            f"{field}: CPU(s) {bad} are not available to this process "
            f"(allowed: {cpu_list(sorted(allowed))})"
        )
    return sorted(set(cpus))


def cpu_list(cpus: Sequence[int]) -> str:
    """The kernel's list syntax (``0-3,6``), which vLLM's ``VLLM_CPU_OMP_THREADS_BIND``
    and ``taskset -c`` read."""
    out: list[str] = []
    for c in sorted(set(cpus)):
        if out and out[-1].split("-")[-1] == str(c - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def pin_thread(cpus: Sequence[int]) -> None:
    """Pins the calling thread (and the threads and processes it starts later) to ``cpus``.

    Linux applies ``sched_setaffinity(0, …)`` to the calling thread only: the process's
    other threads keep their CPUs."""
    os.sched_setaffinity(0, cpus)


def pin_process(
    cpus: Sequence[int], field: str = "trainer.cpus", *, torch_threads: int | None = None
) -> None:
    """Pins this (main) thread, and so the threads and children it starts later, to
    ``cpus``, and torch's intra-op pool to ``torch_threads`` threads (default: one per CPU
    of ``cpus``). Nothing to do for an empty list."""
    if not cpus:
        return
    cpus = check_cpus(cpus, field)
    pin_thread(cpus)
    import torch

    torch.set_num_threads(torch_threads or len(cpus))


@contextlib.contextmanager
def pinned(
    cpus: Sequence[int], field: str = "trainer.cpus", *, torch_threads: int | None = None
) -> Iterator[None]:
    """:func:`pin_process` for the duration of a ``with`` block: this thread's CPUs and
    torch's thread count are given back at its end (a process that runs one run after
    another with other CPU sets checks each against what it may really use)."""
    import torch

    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    pin_process(cpus, field, torch_threads=torch_threads)
    try:
        yield
    finally:
        pin_thread(sorted(before))
        torch.set_num_threads(threads)


class PinnedThread:
    """One worker thread, pinned to ``cpus`` (empty: the CPUs of the thread that starts
    it), that runs the calls given to :meth:`call` one at a time.

    The trainer runs on one so that its CPUs stay its own while the event loop that drives
    the rollouts is pinned elsewhere (``rollout.cpus``). torch runs a CPU op on the calling
    thread, and its OpenMP team is per calling thread, so the trainer's compute stays on
    ``cpus``.

    Example:
        >>> t = PinnedThread([])
        >>> t.call(sum, [1, 2])
        3
        >>> t.close()
    """

    def __init__(self, cpus: Sequence[int], name: str = "agentrl-trainer") -> None:
        self.cpus = list(cpus)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name, initializer=self._start)
        self._ident: int | None = None

    def _start(self) -> None:
        self._ident = threading.get_ident()
        if self.cpus:
            pin_thread(self.cpus)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the pinned thread; blocks the caller until it returns
        (directly, when called from the pinned thread itself)."""
        if threading.get_ident() == self._ident:
            return fn(*args, **kwargs)
        return self._pool.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        """Lets the thread end once its current call returns. Idempotent."""
        self._pool.shutdown(wait=False)
