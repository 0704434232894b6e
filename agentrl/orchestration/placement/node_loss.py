"""Naming the cause when a Ray run fails because the trainer's node was lost.

A lost trainer cannot be replaced mid-run (its optimizer state lives only in its
process), so the run stops. :func:`trainer_loss` tells a lost node from other failures,
and :class:`NodeLostError` carries one message: what was lost, the last good
checkpoint, and the command that continues the run (``agentrl train --resume RUN_DIR``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray

from agentrl.errors import ComponentError
from agentrl.orchestration.placement.adapters import await_refs

__all__ = ["NodeLostError", "node_lost_message", "trainer_loss"]


class NodeLostError(ComponentError):
    """The trainer's node (or a trainer worker) was lost; the message says how to resume."""


def _dead_nodes() -> set[str]:
    return {str(n["NodeID"]) for n in ray.nodes() if not n.get("Alive", False)}


async def trainer_loss(
    workers: Sequence[Any], node_ids: Sequence[str], timeout_s: float = 10.0
) -> str | None:
    """Why the trainer is gone: its node was lost, or a worker died; None when all answer.

    A worker that is slow to answer is not counted as gone (only ``RayActorError`` is).
    """
    for rank, (w, node) in enumerate(zip(workers, node_ids, strict=True)):
        try:
            await await_refs(w.node_id.remote(), timeout_s)
            continue
        except ray.exceptions.RayActorError:
            pass
        except Exception:
            continue
        deadline = time.monotonic() + timeout_s  # the cluster may learn of the node's loss late
        while True:
            if node in await asyncio.to_thread(_dead_nodes):
                return f"the Ray node holding the trainer (node {node[:12]}) was lost"
            if time.monotonic() > deadline:
                return f"trainer worker {rank} died (its node {node[:12]} is still up)"
            await asyncio.sleep(0.5)
    return None


def node_lost_message(
    cause: str, run_dir: Path, checkpoint: str, resources: dict[str, float]
) -> str:
    """The one message of a run stopped by :func:`trainer_loss`'s ``cause``.

    >>> node_lost_message("the Ray node holding the trainer (node ab12) was lost",
    ...                   Path("runs/x"), "runs/x/checkpoints/step_2", {"trainer": 1.0})[:60]
    'the Ray node holding the trainer (node ab12) was lost; the r'
    """
    return (
        f"{cause}; the run cannot go on without its trainer and stopped. The last good "
        f"checkpoint is {checkpoint}. Once a node with the trainer's resources "
        f"({resources}) is back in the cluster, continue with: agentrl train --resume {run_dir}"
    )
