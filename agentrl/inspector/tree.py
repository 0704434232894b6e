"""A tree rollout's group as a tree: its nodes, each leaf's outcome, each turn's advantage.

A leaf of a tree rollout is an ordinary episode whose ``info["tree"]["node_ids"]`` names
the tree node of each model turn (``agentrl.trainer.engine.tree_nodes``). The parent of a
node is the node before it in a leaf's sequence; ids are never parsed. The advantages
are the trainer's own: ``tree_advantages`` (``trainer/algo/tree.py``) over the group's
``group_stats``, discounted per turn as the ``tree_grpo`` estimator does.

>>> view = group_tree(leaves, settings=TreeSettings(norm_by_std=False))  # doctest: +SKIP
>>> [(n["id"], n["value"], n["advantage"]) for n in view["nodes"]]  # doctest: +SKIP
[('0', 0.25, 0.0), ('0.0', 0.5, 0.25), ...]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from agentrl.types import Trajectory

__all__ = [
    "NotATreeLeafError",
    "TreeError",
    "TreeSettings",
    "group_tree",
    "is_tree_leaf",
    "shaped_outcomes",
    "tree_settings",
]

Decode = Callable[[Sequence[int]], list[str]]


class NotATreeLeafError(LookupError):
    """The episode records no tree nodes (it is not a leaf of a tree rollout)."""


class TreeError(ValueError):
    """The group's ``info["tree"]`` records do not describe a tree (the message says why)."""


@dataclass(frozen=True)
class TreeSettings:
    """The run's ``trainer.advantage`` settings the tree's advantages depend on.

    Attributes:
        norm_by_std: Divide by the group's std of leaf outcomes (+ eps).
        eps: Added to the std.
        gamma: Per-turn discount γ^(last turn - turn).
        estimator: The run's estimator (the page notes when it is not ``tree_grpo``).
        whiten: The run's batch whitening (not applied here: it spans the whole batch).
        source: Where the settings came from.
    """

    norm_by_std: bool = True
    eps: float = 1e-6
    gamma: float = 1.0
    estimator: str = "tree_grpo"
    whiten: bool | None = None
    source: str = "defaults"


def tree_settings(config_text: str | None) -> TreeSettings:
    """The settings recorded in a run's config.yaml; defaults (and ``source`` says so) if not."""
    if not config_text:
        return TreeSettings(source="defaults: the run directory has no config.yaml")
    try:
        cfg = yaml.safe_load(config_text)
    except yaml.YAMLError as e:
        return TreeSettings(source=f"defaults: config.yaml does not parse ({e.__class__.__name__})")
    trainer = cfg.get("trainer") if isinstance(cfg, dict) else None
    adv = trainer.get("advantage") if isinstance(trainer, dict) else None
    if not isinstance(adv, dict) or "norm_by_std" not in adv:
        return TreeSettings(source="defaults: config.yaml has no trainer.advantage.norm_by_std")
    d = TreeSettings()
    try:
        return TreeSettings(
            norm_by_std=bool(adv["norm_by_std"]),
            eps=float(adv.get("eps", d.eps)),
            gamma=float(adv.get("gamma", d.gamma)),
            estimator=str(adv.get("estimator", d.estimator)),
            whiten=None if adv.get("whiten") is None else bool(adv["whiten"]),
            source="the run's config.yaml (trainer.advantage)",
        )
    except (TypeError, ValueError):
        return TreeSettings(source="defaults: config.yaml's trainer.advantage is malformed")


def shaped_outcomes(
    batch: Sequence[Trajectory], config_text: str | None
) -> tuple[list[float | None], str]:
    """Each episode's outcome as the trainer scored it, and how it was found.

    ``batch`` is a step's trained episodes; the run's ``trainer.shaping`` (overlong
    penalty, stop-properly, clip, dynamic filter, batch normalization) is applied to it
    as the trainer does. None: the dynamic filter dropped the episode's group.
    """
    from agentrl.trainer.algo.shaping import shape_rewards
    from agentrl.trainer.config import ShapingConfig

    raw: list[float | None] = [float(t.reward) for t in batch]
    try:
        cfg = yaml.safe_load(config_text or "")
    except yaml.YAMLError:
        cfg = None
    trainer = cfg.get("trainer") if isinstance(cfg, dict) else None
    shaping = trainer.get("shaping") if isinstance(trainer, dict) else None
    if not isinstance(shaping, dict):
        return raw, "the episodes' rewards (the run's config records no trainer.shaping)"
    try:
        params = ShapingConfig.model_validate(shaping)
    except ValueError as e:
        first = str(e).splitlines()[0]
        return raw, f"the episodes' rewards (trainer.shaping in config.yaml is invalid: {first})"
    shaped = shape_rewards(batch, params)
    out: list[float | None] = [None] * len(batch)
    for i, score in zip(shaped.kept, shaped.scores, strict=True):
        out[i] = score
    return out, "the rewards shaped by the run's trainer.shaping, over the step's batch"


def is_tree_leaf(t: Trajectory) -> bool:
    """Whether the episode records its tree nodes (``info["tree"]["node_ids"]``)."""
    tree = t.info.get("tree") if isinstance(t.info, dict) else None
    return isinstance(tree, dict) and tree.get("node_ids") is not None


def _num(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _turn_texts(t: Trajectory, decode: Decode | None) -> list[tuple[str, str]]:
    """(the turn's text, what followed it before the next turn) per model turn."""
    spans = [s for s in t.spans if s.end > s.start]
    model = [k for k, s in enumerate(spans) if s.kind == "model"]
    if decode is not None:

        def text(a: int, b: int) -> str:
            return "".join(decode(t.token_ids[a:b]))

        out = []
        for j, k in enumerate(model):
            end = spans[model[j + 1]].start if j + 1 < len(model) else spans[-1].end
            out.append((text(spans[k].start, spans[k].end), text(spans[k].end, end)))
        return out
    said = [m for m in t.messages if m.role == "assistant"]
    if len(said) != len(model):  # no tokenizer and no one-to-one messages: sizes only
        return [(f"({spans[k].end - spans[k].start} tokens)", "") for k in model]
    out = []
    for m in said:
        calls = "".join(f"\n→ {c.name}({c.arguments})" for c in m.tool_calls)
        out.append((m.content + calls, ""))
    return out


def _paths(leaves: Sequence[Trajectory]) -> tuple[list[list[str]], list[list[str]]]:
    """Per leaf: the node of each model turn, and its path (the nodes root to leaf)."""
    from agentrl.trainer.engine.tree_nodes import tree_node_ids

    turn_nodes, paths = [], []
    for t in leaves:
        try:
            ids = tree_node_ids(t)
        except ValueError as e:
            raise TreeError(str(e)) from None
        if ids is None:  # outside a tree: one node of its own, as the trainer does
            n = sum(1 for s in t.spans if s.kind == "model" and s.end > s.start)
            ids = [f"episode {t.episode_id}"] * n
        path: list[str] = []
        for node in ids:
            if path and path[-1] == node:
                continue
            if node in path:
                raise TreeError(
                    f"episode {t.episode_id}: info['tree']['node_ids'] returns to node "
                    f"{node!r} after leaving it ({ids})"
                )
            path.append(node)
        turn_nodes.append(ids)
        paths.append(path)
    return turn_nodes, paths


def group_tree(
    leaves: Sequence[Trajectory],
    *,
    outcomes: Sequence[float] | None = None,
    settings: TreeSettings | None = None,
    decode: Decode | None = None,
) -> dict[str, Any]:
    """One group's tree, JSON-ready: ``{group_id, settings, group, nodes, leaves}``.

    Args:
        leaves: The group's episodes (an episode outside the tree is a node of its own).
        outcomes: Each leaf's outcome R as the trainer saw it (shaped); default its reward.
        settings: ``trainer.advantage`` settings (default: ``TreeSettings()``).
        decode: Token ids → per-token text; without it a turn's text is its assistant
            message.

    ``nodes`` (depth first, children in order of first appearance): ``id``, ``parent``
    (None under the group), ``depth``, ``children``, ``turns`` (``turn``, ``text``,
    ``after``: the tool/env text that followed), ``leaves`` (positions in ``leaves``),
    ``value`` V(n) (mean outcome of the leaves under it), ``advantage`` (before the
    discount), ``choice`` (False: its parent's only child, it takes the parent's Â).
    ``leaves``: ``episode_id``, ``reward``, ``outcome``, ``stop_reason``, ``path``,
    ``turn_advantages`` (each model turn's, discounted). Leaves without a model turn are
    listed but not trained, as the trainer skips them.

    Raises:
        TreeError: A leaf whose node ids do not match its model turns, a node under two
            parents, a leaf returning to a node it left.
    """
    import torch

    from agentrl.trainer.algo.advantages import group_stats
    from agentrl.trainer.algo.tree import tree_advantages

    s = settings or TreeSettings()
    turn_nodes, paths = _paths(leaves)
    R = [float(t.reward) for t in leaves] if outcomes is None else [float(o) for o in outcomes]
    parent: dict[str, str | None] = {}
    owner: dict[str, int] = {}  # node -> the first leaf through it
    children: dict[str | None, list[str]] = {None: []}
    for b, path in enumerate(paths):
        for j, node in enumerate(path):
            up = path[j - 1] if j else None
            if node in parent and parent[node] != up:
                raise TreeError(
                    f"node {node!r} has two parents: {parent[node]!r} (episode "
                    f"{leaves[owner[node]].episode_id}) and {up!r} (episode "
                    f"{leaves[b].episode_id}); a node's turns must be one shared prefix"
                )
            if node not in parent:
                parent[node], owner[node] = up, b
                children.setdefault(up, []).append(node)
                children[node] = []
    trained = [b for b, ids in enumerate(turn_nodes) if ids]
    under: dict[str, list[int]] = {n: [] for n in parent}
    for b in trained:
        for node in paths[b]:
            under[node].append(b)
    value = {}
    for node, bs in under.items():
        rs = [R[b] for b in bs]
        value[node] = (rs[0] if min(rs) == max(rs) else sum(rs) / len(rs)) if rs else math.nan
    node_adv: dict[str, float] = {}
    turn_adv: dict[int, list[float]] = {b: [] for b in range(len(leaves))}
    mean = std = math.nan
    if trained:
        index = {n: i for i, n in enumerate(parent)}
        K = max(len(turn_nodes[b]) for b in trained)
        node_BK = torch.full((len(trained), K), -1, dtype=torch.long)
        mask_BK = torch.zeros(len(trained), K)
        for row, b in enumerate(trained):
            n = len(turn_nodes[b])
            node_BK[row, :n] = torch.tensor([index[x] for x in turn_nodes[b]])
            mask_BK[row, :n] = 1.0
        R_B = torch.tensor([R[b] for b in trained], dtype=torch.float64)
        mean_B, std_B, _, _ = group_stats(R_B, torch.zeros(len(trained), dtype=torch.long))
        mean, std = float(mean_B[0]), float(std_B[0])
        adv_BK = tree_advantages(
            R_B, node_BK, mask_BK, mean_B, std_B, norm_by_std=s.norm_by_std, eps=s.eps
        )
        for row, b in enumerate(trained):
            n = len(turn_nodes[b])
            for k, node in enumerate(turn_nodes[b]):
                a = float(adv_BK[row, k])
                node_adv.setdefault(node, a)
                turn_adv[b].append(a * s.gamma ** (n - 1 - k))  # as tree_grpo discounts
    nodes: list[dict[str, Any]] = []
    texts_of: dict[int, list[tuple[str, str]]] = {}

    def visit(node: str, depth: int) -> None:
        b = owner[node]
        if b not in texts_of:
            texts_of[b] = _turn_texts(leaves[b], decode)
        texts = texts_of[b]
        up = parent[node]
        nodes.append(
            {
                "id": node,
                "parent": up,
                "depth": depth,
                "children": children[node],
                "turns": [
                    {"turn": k, "text": texts[k][0], "after": texts[k][1]}
                    for k, x in enumerate(turn_nodes[b])
                    if x == node
                ],
                "leaves": under[node],
                "value": _num(value[node]),
                "advantage": _num(node_adv.get(node, math.nan)),
                "choice": up is None or len(children[up]) > 1,
            }
        )
        for c in children[node]:
            visit(c, depth + 1)

    for root in children[None]:
        visit(root, 0)
    return {
        "group_id": leaves[0].group_id if leaves else None,
        "settings": asdict(s),
        "group": {"mean": _num(mean), "std": _num(std), "trained_leaves": len(trained)},
        "nodes": nodes,
        "leaves": [
            {
                "episode_id": t.episode_id,
                "reward": _num(float(t.reward)),
                "outcome": _num(R[b]),
                "stop_reason": str(t.stop_reason),
                "path": paths[b],
                "trained": bool(turn_nodes[b]),
                "turn_advantages": [_num(a) for a in turn_adv[b]],
            }
            for b, t in enumerate(leaves)
        ],
    }
