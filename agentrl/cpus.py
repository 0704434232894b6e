"""CPU pinning: the inference servers and the training process on disjoint CPU sets.

On a CPU-only machine the vLLM server and the trainer otherwise share every core, and
overlapping generation with training (``orchestration.mode`` one_step_off/fully_async)
buys nothing. ``inference.cpus=[0]`` and ``trainer.cpus=[1]`` give each side its own.

Example:
    >>> from agentrl.cpus import check_cpus
    >>> check_cpus([0], "trainer.cpus")
    [0]
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from agentrl.errors import UserError

__all__ = ["check_cpus", "cpu_list", "pin_process"]


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


def pin_process(cpus: Sequence[int], field: str = "trainer.cpus") -> None:
    """Pins this process (and the threads and children it starts later) to ``cpus``, and
    torch's intra-op pool to one thread per CPU. Nothing to do for an empty list."""
    if not cpus:
        return
    cpus = check_cpus(cpus, field)
    os.sched_setaffinity(0, cpus)
    import torch

    torch.set_num_threads(len(cpus))
