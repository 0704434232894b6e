"""Tree credit (``tree_grpo``): each turn is credited by its subtree against its siblings.

A tree rollout samples several continuations from one shared prefix; every leaf is an
ordinary episode. Each model turn of a leaf belongs to a tree *node*: a run of turns
that the leaves under it share (``node_BR``; turns of one node carry one id, a branch
point starts new nodes). With V(n) the mean outcome of the leaves under node n:

* a turn in a child of the root (the group): Â = (V(n) - mean_g R) — GRPO's advantage
  with the leaves under n in place of one episode;
* a turn in a deeper node n with parent p: Â = V(n) - V(p), the value of the choice made
  at n against its siblings' (the leaves under p include n's own);
* a node that is its parent's only child made no choice: its turns take the parent's Â.

Then, as grpo: divided by (std_g R + ε) of the group's leaf outcomes when ``norm_by_std``,
and discounted by γ^(last turn - turn). With width 1 below the root every leaf has one
node, V(n) = R, and Â is GRPO's (R - mean_g R) / (std_g R + ε) exactly.
"""

from __future__ import annotations

import math

import torch

__all__ = ["tree_advantages"]


def _value(sum_: float, n: int, lo: float, hi: float) -> float:
    # Equal outcomes: exactly that outcome (sum/n can be an ulp off, as group_stats notes).
    return lo if lo == hi else sum_ / n


def tree_advantages(
    outcome_B: torch.Tensor,
    node_BR: torch.Tensor,
    mask_BR: torch.Tensor,
    group_mean_B: torch.Tensor,
    group_std_B: torch.Tensor,
    *,
    norm_by_std: bool,
    eps: float,
) -> torch.Tensor:
    """Per-token tree credit (B, R) in float64, before any discount; 0 on padding.

    Args:
        outcome_B: Each leaf's outcome R (its total reward).
        node_BR: Tree node id of each model token, unique across the batch (ids of
            different groups never coincide); a leaf's nodes run root to leaf in order.
        mask_BR: 1.0 on model tokens.
        group_mean_B, group_std_B: Each leaf's group mean and std of R
            (``group_stats``: a group of one has mean 0 and std 1).
        norm_by_std: Divide by (std + ε), as grpo.
        eps: Added to the std.

    Raises:
        ValueError: A node seen under two different parents, or a leaf that returns to a
            node it left (the ids do not describe a tree).
    """
    B, R = mask_BR.shape
    R_B = outcome_B.to(torch.float64).tolist()
    paths: list[list[int]] = []
    counts: list[list[int]] = []
    for b in range(B):
        n = int(mask_BR[b].sum().item())
        nodes, cnt = torch.unique_consecutive(node_BR[b, :n], return_counts=True)
        path = [int(v) for v in nodes.tolist()]
        if len(set(path)) != len(path):
            raise ValueError(f"tree: row {b} returns to a node it left ({path})")
        paths.append(path)
        counts.append([int(c) for c in cnt.tolist()])
    parent: dict[int, int | None] = {}
    children: dict[int | None, set[int]] = {}
    stats: dict[int, list[float]] = {}  # node -> [sum, n, lo, hi]
    for b, path in enumerate(paths):
        for j, node in enumerate(path):
            up = path[j - 1] if j else None
            if parent.setdefault(node, up) != up:
                raise ValueError(
                    f"tree: node {node} has two parents ({parent[node]} and {up}); "
                    "node ids must be unique across the batch"
                )
            children.setdefault(up, set()).add(node)
            s = stats.setdefault(node, [0.0, 0.0, math.inf, -math.inf])
            s[0] += R_B[b]
            s[1] += 1
            s[2] = min(s[2], R_B[b])
            s[3] = max(s[3], R_B[b])
    value = {k: _value(s[0], int(s[1]), s[2], s[3]) for k, s in stats.items()}
    mean_B = group_mean_B.to(torch.float64).tolist()
    std_B = group_std_B.to(torch.float64).tolist()
    adv_BR = torch.zeros(B, R, dtype=torch.float64, device=mask_BR.device)
    for b, path in enumerate(paths):
        per_node: list[float] = []
        for j, node in enumerate(path):
            if j == 0:
                a = value[node] - mean_B[b]
            elif len(children[path[j - 1]]) > 1:
                a = value[node] - value[path[j - 1]]
            else:  # the only child: no choice was made here
                a = per_node[-1]
            per_node.append(a)
        if norm_by_std:  # (R - mean) / (std + ε), divided as grpo divides
            per_node = [a / (std_B[b] + eps) for a in per_node]
        row = torch.tensor(per_node, dtype=torch.float64)
        n = sum(counts[b])
        adv_BR[b, :n] = row.repeat_interleave(torch.tensor(counts[b])).to(adv_BR.device)
    return adv_BR
