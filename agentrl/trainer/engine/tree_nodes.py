"""Tree-rollout leaves → the tree node of each model token (for ``tree_grpo``).

A leaf of a tree rollout is an ordinary episode that records, per model turn, the tree
node it belongs to: ``Trajectory.info["tree"] = {"node_ids": [...]}``, one id per model
span in order. Turns that leaves share (their common prefix) carry the same id; a branch
point starts a new id in each child. Ids need only be unique within the episode's group.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch

from agentrl.types import Trajectory

__all__ = ["node_BR", "tree_node_ids"]


def tree_node_ids(t: Trajectory) -> list[str] | None:
    """The tree node of each model turn of a tree-rollout leaf, or None (not in a tree).

    Read from ``t.info["tree"]["node_ids"]``: one id per model span (``spans`` of kind
    "model", in order); the turns that leaves share carry the same id, and ids are unique
    within the episode's group. Raises ValueError naming the trajectory when the count
    differs from its model turns.
    """
    tree = t.info.get("tree")
    if not isinstance(tree, dict) or tree.get("node_ids") is None:
        return None
    ids = [str(i) for i in tree["node_ids"]]
    turns = sum(1 for s in t.spans if s.kind == "model" and s.end > s.start)
    if len(ids) != turns:
        raise ValueError(
            f"trajectory {t.episode_id} (task {t.task_id}): info['tree']['node_ids'] has "
            f"{len(ids)} ids for {turns} model turns (one id per model turn)"
        )
    return ids


def node_BR(
    trajectories: Sequence[Trajectory], positions: Sequence[list[int]], R: int
) -> torch.Tensor | None:
    """The tree node of each model token (B, R), -1 on padding; None when no episode is in
    a tree. Ids are unique across the batch: (group, node id) for a leaf's turns, a node of
    its own for an episode outside a tree. ``positions[b]``: the model tokens' indices.
    """
    ids_B = [tree_node_ids(t) for t in trajectories]
    if all(ids is None for ids in ids_B):
        return None
    out_BR = torch.full((len(trajectories), R), -1, dtype=torch.long)
    names: dict[tuple[str, str] | int, int] = {}
    for b, (t, pos, ids) in enumerate(zip(trajectories, positions, ids_B, strict=True)):
        if ids is None:  # outside a tree: one node of its own
            out_BR[b, : len(pos)] = names.setdefault(b, len(names))
            continue
        spans = [s for s in t.spans if s.kind == "model" and s.end > s.start]
        starts = [s.start for s in spans]
        for j, p in enumerate(pos):
            k = max(bisect.bisect_right(starts, p) - 1, 0)
            out_BR[b, j] = names.setdefault((t.group_id, ids[k]), len(names))
    return out_BR
