"""Trajectories → tensors, and micro-batches formed by a token budget.

Per-episode quantities live in "compact" tensors (B, R): row b holds the model tokens
of episode b (``loss_mask == 1``), left-aligned, in order. The logprob of token t is
predicted at position t-1, so ``pos_BR - 1`` indexes the hidden state that scores it.

A ``per_turn`` episode (``Trajectory.sample_starts``) is still one row: its samples
(each a prompt rendered by the template and one model turn) lie one after another,
and their position ids restart at each sample start, so the model sees them as
packed sequences (HF builds the block-diagonal mask from restarting position ids
when no attention mask is given). Rewards, groups and advantages stay per episode
and reach the model tokens of every sample.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentrl.trainer.engine.tree_nodes import node_BR as tree_node_BR
from agentrl.types import Trajectory

__all__ = [
    "Batch",
    "MicroBatch",
    "build_batch",
    "make_micro_batch",
    "partition_balanced",
    "plan_micro_batches",
    "shared_prefix_len",
]


@dataclass
class Batch:
    """A training batch.

    Attributes:
        ids: Token ids per episode, each (L_b,) int64.
        lengths_B: L_b.
        pos_BR: Position in the episode of each model token (0 on padding).
        mask_BR: 1.0 on model tokens.
        rollout_logp_BR: Sampling logprobs μ.
        versions_BR: Weight version per model token (-1 on padding).
        rewards_BR: Per-token rewards (turn rewards + outcome remainder).
        turn_BR: Model-turn index per token.
        group_B: Integer group id.
        scores_B: Shaped total reward per episode.
        truncated_B: Whether each episode was truncated.
        episode_ids: For error messages.
        positions: Position ids per episode, restarting at each ``per_turn`` sample;
            None: 0..L_b-1 for every row.
        roles_BR: Under ``trainer.lora.per_role``, the role (index into
            ``trainer.lora.roles``) of each model token, -1 on padding; else None.
        node_BR: When some episode is a leaf of a tree rollout (``tree_nodes.tree_node_ids``),
            the tree node of each model token, unique across the batch (an episode
            outside a tree is one node of its own), -1 on padding; else None.
    """

    ids: list[torch.Tensor]
    lengths_B: torch.Tensor
    pos_BR: torch.Tensor
    mask_BR: torch.Tensor
    rollout_logp_BR: torch.Tensor
    versions_BR: torch.Tensor
    rewards_BR: torch.Tensor
    turn_BR: torch.Tensor
    group_B: torch.Tensor
    scores_B: torch.Tensor
    truncated_B: torch.Tensor
    episode_ids: list[str]
    positions: list[torch.Tensor] | None = None
    roles_BR: torch.Tensor | None = None
    node_BR: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return len(self.ids)

    @property
    def resp_len_B(self) -> torch.Tensor:
        return self.mask_BR.sum(-1)


def _check(t: Trajectory) -> list[int]:
    t.validate()
    if not t.token_ids:
        raise ValueError(f"trajectory {t.episode_id} (task {t.task_id}) has no tokens")
    if any(m not in (0, 1) for m in t.loss_mask):
        raise ValueError(f"trajectory {t.episode_id}: loss_mask must hold only 0 and 1")
    if t.loss_mask[0] == 1:
        raise ValueError(
            f"trajectory {t.episode_id}: token 0 is marked as a model token, but no position "
            "predicts the first token (a prompt must precede the model's tokens)"
        )
    return [i for i, m in enumerate(t.loss_mask) if m]


def build_batch(
    trajectories: Sequence[Trajectory], scores: Sequence[float], truncated: Sequence[bool]
) -> Batch:
    """Validates and tensorizes episodes.

    Rewards: each turn reward (``Trajectory.turn_rewards``) sits on the last model token at
    or before the turn's last index; ``score - Σ turn rewards`` sits on the last model
    token, so the per-token rewards of an episode sum to its shaped score.

    Raises:
        ValueError: Naming the trajectory whose fields disagree.
    """
    positions = [_check(t) for t in trajectories]
    B = len(trajectories)
    R = max((len(p) for p in positions), default=0)
    R = max(R, 1)
    pos_BR = torch.zeros(B, R, dtype=torch.long)
    mask_BR = torch.zeros(B, R)
    mu_BR = torch.zeros(B, R)
    ver_BR = torch.full((B, R), -1, dtype=torch.long)
    rew_BR = torch.zeros(B, R)
    turn_BR = torch.zeros(B, R, dtype=torch.long)
    group_names: dict[str, int] = {}
    for b, (t, pos) in enumerate(zip(trajectories, positions, strict=True)):
        group_names.setdefault(t.group_id, len(group_names))
        n = len(pos)
        if n == 0:
            continue
        pos_BR[b, :n] = torch.tensor(pos)
        mask_BR[b, :n] = 1.0
        mu_BR[b, :n] = torch.tensor([t.rollout_logprobs[p] for p in pos])
        ver_BR[b, :n] = torch.tensor([t.weight_versions[p] for p in pos])
        ends = set()
        turn_total = 0.0
        for idx, r in t.turn_rewards:
            j = bisect.bisect_right(pos, idx) - 1
            j = max(j, 0)
            ends.add(j)
            rew_BR[b, j] += r
            turn_total += r
        rew_BR[b, n - 1] += float(scores[b]) - turn_total
        turn = 0
        for j in range(1, n):
            # A new model turn starts after a gap (observation tokens) or a turn's last token.
            if pos[j] != pos[j - 1] + 1 or (j - 1) in ends:
                turn += 1
            turn_BR[b, j] = turn
    return Batch(
        ids=[torch.tensor(t.token_ids, dtype=torch.long) for t in trajectories],
        lengths_B=torch.tensor([len(t) for t in trajectories], dtype=torch.long),
        pos_BR=pos_BR,
        mask_BR=mask_BR,
        rollout_logp_BR=mu_BR,
        versions_BR=ver_BR,
        rewards_BR=rew_BR,
        turn_BR=turn_BR,
        group_B=torch.tensor([group_names[t.group_id] for t in trajectories], dtype=torch.long),
        scores_B=torch.tensor([float(s) for s in scores]),
        truncated_B=torch.tensor(list(truncated), dtype=torch.bool),
        episode_ids=[t.episode_id for t in trajectories],
        positions=(
            [torch.tensor(t.position_ids(), dtype=torch.long) for t in trajectories]
            if any(t.sample_starts for t in trajectories)
            else None
        ),
        node_BR=tree_node_BR(trajectories, positions, R),
    )


def _row_positions(batch: Batch, r: int) -> torch.Tensor:
    if batch.positions is None:
        return torch.arange(int(batch.lengths_B[r]))
    return batch.positions[r]


def partition_balanced(rows: Sequence[int], lengths: Sequence[int], k: int) -> list[list[int]]:
    """Splits rows into k bins of near-equal total length (LPT greedy, Graham 1969).

    Longest first, each to the lightest bin; every bin is non-empty when len(rows) ≥ k.
    Bins keep the rows' original relative order.
    """
    bins: list[list[int]] = [[] for _ in range(k)]
    load = [0] * k
    for r in sorted(rows, key=lambda r: (-lengths[r], r)):
        j = min(range(k), key=lambda i: (load[i], len(bins[i]), i))
        bins[j].append(r)
        load[j] += lengths[r]
    order = {r: i for i, r in enumerate(rows)}
    return [sorted(b, key=order.__getitem__) for b in bins]


def _padded_groups(rows: Sequence[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    # Sorted by length, cut greedily so that rows × longest ≤ budget.
    groups: list[list[int]] = []
    cur: list[int] = []
    for r in sorted(rows, key=lambda r: (-lengths[r], r)):
        longest = lengths[cur[0]] if cur else lengths[r]
        if cur and (len(cur) + 1) * longest > budget:
            groups.append(cur)
            cur = []
        cur.append(r)
    if cur:
        groups.append(cur)
    return groups


def plan_micro_batches(
    rows: Sequence[int],
    lengths: Sequence[int],
    *,
    strategy: str,
    token_budget: int,
    micro_batch_size: int,
    packing: bool,
    min_count: int = 0,
) -> list[list[int]]:
    """Groups rows into micro-batches; at least ``min_count`` of them (extra ones may be empty).

    token_budget + packing: the fewest bins whose token sums fit the budget (a row longer
    than the budget gets a bin of its own), balanced by LPT. token_budget without packing:
    length-sorted groups whose padded size fits. fixed: ``micro_batch_size`` rows each.
    """
    rows = list(rows)
    if not rows:
        return [[] for _ in range(min_count)]
    if strategy == "fixed":
        groups = [rows[i : i + micro_batch_size] for i in range(0, len(rows), micro_batch_size)]
    elif packing:
        total = sum(lengths[r] for r in rows)
        k = max(1, math.ceil(total / token_budget), min_count)
        while True:
            k = min(k, len(rows))
            groups = partition_balanced(rows, lengths, k)
            over = [g for g in groups if len(g) > 1 and sum(lengths[r] for r in g) > token_budget]
            if not over or k == len(rows):
                break
            k += 1
    else:
        groups = _padded_groups(rows, lengths, token_budget)
        while len(groups) < min_count and any(len(g) > 1 for g in groups):
            big = max(range(len(groups)), key=lambda i: len(groups[i]))
            g = groups.pop(big)
            groups[big:big] = [g[: len(g) // 2], g[len(g) // 2 :]]
    groups = [g for g in groups if g]
    groups.extend([] for _ in range(min_count - len(groups)))
    return groups


@dataclass
class MicroBatch:
    """Model inputs for a set of rows.

    Attributes:
        rows: Batch rows, in the order of the outputs.
        input_ids: (1, N) packed or (b, L) padded.
        position_ids: Same shape; restarts at 0 per episode when packed.
        attention_mask: (b, L) when padded; None when packed.
        sel_N: Flat indices into the (rows × length) hidden states that predict model tokens.
        targets_N: The model tokens they predict.
        R: Compact columns of these rows (their most model tokens).
        num_tokens: Real (unpadded) tokens.
        prefix_ids: (1, P) tokens that begin every row, run once for all rows (see
            :func:`shared_prefix_len`); ``input_ids`` then holds the rows after them,
            ``position_ids`` start at P, ``attention_mask`` is (b, P + L) and ``sel_N``
            indexes the hidden states after the prefix. None: no shared prefix.
    """

    rows: list[int]
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    sel_N: torch.Tensor
    targets_N: torch.Tensor
    R: int
    num_tokens: int
    prefix_ids: torch.Tensor | None = None

    def to(self, device: torch.device) -> MicroBatch:
        am = self.attention_mask.to(device) if self.attention_mask is not None else None
        pre = self.prefix_ids.to(device) if self.prefix_ids is not None else None
        return MicroBatch(
            self.rows,
            self.input_ids.to(device),
            self.position_ids.to(device),
            am,
            self.sel_N.to(device),
            self.targets_N.to(device),
            self.R,
            self.num_tokens,
            pre,
        )


MIN_SHARED_TOKENS = 64
"""Fewest prompt tokens a shared prefix must save (its length × (rows - 1)) to be split off."""


def shared_prefix_len(batch: Batch, rows: Sequence[int]) -> int:
    """Length P of the prompt that begins every row, ending before any scored position.

    Every row's tokens ``0..P-1`` are equal, and P is at most the first model token's
    position minus one, so that every hidden state that scores a model token (position
    ``p - 1``) lies after the prefix. 0 for one row or for ``per_turn`` rows.
    """
    if len(rows) < 2 or batch.positions is not None:
        return 0
    cap = min(int(batch.pos_BR[r, 0]) - 1 for r in rows)
    if cap <= 0:
        return 0
    head_bN = torch.stack([batch.ids[r][:cap] for r in rows])
    same_N = (head_bN == head_bN[:1]).all(0)
    return cap if bool(same_N.all()) else int(same_N.long().argmin())


def make_micro_batch(
    batch: Batch, rows: Sequence[int], packing: bool, share_prefix: bool = False
) -> MicroBatch:
    """Builds model inputs for ``rows`` (packed into one row, or right-padded).

    With ``share_prefix`` (padded rows only), a prompt that begins every row
    (:func:`shared_prefix_len`, when it saves at least ``MIN_SHARED_TOKENS``) goes to
    ``prefix_ids``, to be run once for the micro-batch instead of once per row.
    """
    rows = list(rows)
    n_B = batch.mask_BR[rows].sum(-1).long()
    R = max(int(n_B.max()), 1)
    sel: list[torch.Tensor] = []
    tgt: list[torch.Tensor] = []
    if packing:
        offset = 0
        for i, r in enumerate(rows):
            p = batch.pos_BR[r, : int(n_B[i])]
            sel.append(offset + p - 1)
            tgt.append(batch.ids[r][p])
            offset += int(batch.lengths_B[r])
        ids = torch.cat([batch.ids[r] for r in rows])[None]
        position_ids = torch.cat([_row_positions(batch, r) for r in rows])[None]
        attn = None
    else:
        L = int(batch.lengths_B[rows].max())
        ids = torch.zeros(len(rows), L, dtype=torch.long)
        attn = torch.zeros(len(rows), L, dtype=torch.long)
        for i, r in enumerate(rows):
            n = int(batch.lengths_B[r])
            ids[i, :n] = batch.ids[r]
            attn[i, :n] = 1
            p = batch.pos_BR[r, : int(n_B[i])]
            sel.append(i * L + p - 1)
            tgt.append(batch.ids[r][p])
        position_ids = torch.arange(L)[None].expand(len(rows), L).contiguous()
        if batch.positions is not None and any(
            int(batch.positions[r][-1]) != int(batch.lengths_B[r]) - 1 for r in rows
        ):
            # per_turn samples in a row: positions restart at each sample, padding is a
            # sequence of its own, and no attention mask, so that HF masks the samples
            # apart (right padding never reaches the real tokens of a causal model).
            for i, r in enumerate(rows):
                n = int(batch.lengths_B[r])
                position_ids[i, :n] = batch.positions[r]
                position_ids[i, n:] = torch.arange(L - n)
            attn = None
    P = shared_prefix_len(batch, rows) if share_prefix and attn is not None else 0
    prefix = None
    if P * (len(rows) - 1) >= MIN_SHARED_TOKENS:
        # The rows after the prefix; the mask still covers it (the cache's positions).
        prefix = ids[:1, :P].clone()
        ids, position_ids = ids[:, P:].contiguous(), position_ids[:, P:].contiguous()
        sel = [s - (i + 1) * P for i, s in enumerate(sel)]  # row i: i * (L - P) + p - 1 - P
    return MicroBatch(
        rows=rows,
        input_ids=ids,
        position_ids=position_ids,
        attention_mask=attn,
        sel_N=torch.cat(sel).long(),
        targets_N=torch.cat(tgt).long(),
        R=R,
        num_tokens=int(batch.lengths_B[rows].sum()),
        prefix_ids=prefix,
    )
