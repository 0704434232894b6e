"""tree_grpo against values derived by hand, and its reduction to grpo."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.algo.advantages import AdvantageInputs, compute_advantages
from agentrl.trainer.algo.tree import tree_advantages


def _tree_inputs(
    paths: list[list[int]], rewards: list[float], groups: list[int], tokens_per_turn: int = 2, **kw
) -> AdvantageInputs:
    """Row b: one model turn per node of ``paths[b]`` (``tokens_per_turn`` tokens each),
    its outcome on its last token; turn k's tokens carry node ``paths[b][k]``."""
    B = len(paths)
    R = max(len(p) for p in paths) * tokens_per_turn
    mask = torch.zeros(B, R)
    rew = torch.zeros(B, R)
    turn = torch.zeros(B, R, dtype=torch.long)
    node = torch.full((B, R), -1, dtype=torch.long)
    for b, path in enumerate(paths):
        n = len(path) * tokens_per_turn
        mask[b, :n] = 1
        rew[b, n - 1] = rewards[b]
        for k, nd in enumerate(path):
            turn[b, k * tokens_per_turn : (k + 1) * tokens_per_turn] = k
            node[b, k * tokens_per_turn : (k + 1) * tokens_per_turn] = nd
    return AdvantageInputs(rew, mask, turn, torch.tensor(groups), node_BR=node, **kw)


def _per_turn(adv: torch.Tensor, x: AdvantageInputs, tokens_per_turn: int = 2) -> list[list[float]]:
    out = []
    for b in range(adv.shape[0]):
        n = int(x.mask_BR[b].sum())
        row = adv[b, :n].view(-1, tokens_per_turn)
        assert torch.all(row == row[:, :1]), "one advantage per turn"
        assert torch.all(adv[b, n:] == 0), "padding is 0"
        out.append([float(v) for v in row[:, 0]])
    return out


# Depth 2, width 2: the root (the task) branches into nodes A=1, B=2 at turn 0, each
# branches again at turn 1: AA=11, AB=12 under A, BA=21, BB=22 under B.
PATHS = [[1, 11], [1, 12], [2, 21], [2, 22]]
REWARDS = [1.0, 0.0, 0.0, 0.0]


def test_depth_2_width_2_by_hand_without_std() -> None:
    """Leaves AA, AB, BA, BB with outcomes 1, 0, 0, 0.

    V(root) = mean of the 4 leaves = 1/4; V(A) = (1 + 0)/2 = 1/2; V(B) = 0;
    V(AA) = 1, V(AB) = V(BA) = V(BB) = 0.
    Turn 0 (root's children, vs the group mean): A: 1/2 - 1/4 = 1/4; B: 0 - 1/4 = -1/4.
    Turn 1 (vs the parent): AA: 1 - 1/2 = 1/2; AB: 0 - 1/2 = -1/2; BA: 0 - 0 = 0; BB: 0.
    So the leaves' turns get AA [1/4, 1/2], AB [1/4, -1/2], BA [-1/4, 0], BB [-1/4, 0].
    """
    x = _tree_inputs(PATHS, REWARDS, [0, 0, 0, 0], norm_by_std=False)
    adv, _ = compute_advantages("tree_grpo", x)
    assert _per_turn(adv, x) == [[0.25, 0.5], [0.25, -0.5], [-0.25, 0.0], [-0.25, 0.0]]


def test_depth_2_width_2_by_hand_with_std() -> None:
    """As above, divided by the group's std of leaf outcomes (grpo's norm_by_std).

    Outcomes 1, 0, 0, 0: mean 1/4, squared deviations 9/16 + 3·1/16 = 3/4, unbiased
    variance (3/4)/3 = 1/4, std 1/2. Every advantage doubles (ε = 1e-6 aside):
    AA [1/2, 1], AB [1/2, -1], BA [-1/2, 0], BB [-1/2, 0].
    """
    x = _tree_inputs(PATHS, REWARDS, [0, 0, 0, 0])
    adv, _ = compute_advantages("tree_grpo", x)
    want = [[0.5, 1.0], [0.5, -1.0], [-0.5, 0.0], [-0.5, 0.0]]
    got = _per_turn(adv, x)
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, abs=1e-5)


def test_width_1_below_the_root_is_grpo_exactly() -> None:
    """Four independent 3-turn episodes (each turn its own node, one child each): every
    node below the root is an only child, so it takes its parent's advantage, and the root
    child's V is the leaf's own outcome R. With outcomes 1, 0, 0, 0 grpo gives every turn
    (R - 1/4) / (1/2 + ε): 1.5 for the first episode and -0.5 for the others."""
    paths = [[10 * b + k for k in range(3)] for b in range(4)]
    for norm in (True, False):
        x = _tree_inputs(paths, REWARDS, [0, 0, 0, 0], norm_by_std=norm)
        tree, _ = compute_advantages("tree_grpo", x)
        grpo, _ = compute_advantages("grpo", x)
        assert torch.equal(tree, grpo)
    assert _per_turn(tree, x)[0] == pytest.approx([0.75] * 3)  # norm_by_std=False: R - 1/4
    x = _tree_inputs(paths, REWARDS, [0, 0, 0, 0])
    got = _per_turn(compute_advantages("tree_grpo", x)[0], x)[0]
    assert got == pytest.approx([1.5] * 3, abs=1e-5)


def test_one_node_per_episode_and_no_tree_are_grpo() -> None:
    # Uneven lengths, two groups, a singleton group, a discount and an in-reward penalty.
    paths = [[1, 1], [2, 2, 2], [3], [4, 4], [5]]
    x = _tree_inputs(paths, [1.0, 0.0, 0.5, 2.0, 3.0], [0, 0, 0, 1, 2], gamma=0.9)
    x.penalty_BR = 0.01 * x.mask_BR
    grpo, _ = compute_advantages("grpo", x)
    assert torch.allclose(compute_advantages("tree_grpo", x)[0], grpo, atol=1e-6)
    x.node_BR = None  # no tree at all: every episode one node
    assert torch.allclose(compute_advantages("tree_grpo", x)[0], grpo, atol=1e-6)
    x.gamma = 1.0
    grpo, _ = compute_advantages("grpo", x)
    assert torch.equal(compute_advantages("tree_grpo", x)[0], grpo)


def test_chain_turns_inherit_and_uneven_tree() -> None:
    """Root → A (turn 0) → A' (turn 1, A's only child) → {X, Y} (turn 2); root → B.

    Outcomes: X 1, Y 0, B 0 (norm_by_std off). V(root) = 1/3, V(A) = V(A') = 1/2.
    A: 1/2 - 1/3 = 1/6; A' is an only child: 1/6 again; X: 1 - 1/2 = 1/2; Y: -1/2.
    B (one turn): 0 - 1/3 = -1/3.
    """
    x = _tree_inputs([[1, 2, 3], [1, 2, 4], [5]], [1.0, 0.0, 0.0], [0, 0, 0], norm_by_std=False)
    got = _per_turn(compute_advantages("tree_grpo", x)[0], x)
    want = [[1 / 6, 1 / 6, 0.5], [1 / 6, 1 / 6, -0.5], [-1 / 3]]
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, abs=1e-6)


def test_equal_outcomes_give_exactly_zero() -> None:
    x = _tree_inputs(PATHS, [0.3] * 4, [0, 0, 0, 0])
    assert torch.all(compute_advantages("tree_grpo", x)[0] == 0)


@pytest.mark.parametrize(
    ("paths", "match"),
    [
        ([[1, 3], [2, 3]], "two parents"),  # node 3 under 1 and under 2
        ([[1, 2, 1]], "returns to a node"),
    ],
)
def test_ids_that_are_not_a_tree_are_refused(paths: list[list[int]], match: str) -> None:
    x = _tree_inputs(paths, [1.0] * len(paths), [0] * len(paths))
    with pytest.raises(ValueError, match=match):
        compute_advantages("tree_grpo", x)


def test_tree_advantages_ignores_padding_ids() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    node = torch.tensor([[7, 8, 99], [7, -1, -1]])  # 99 on padding must not count
    adv = tree_advantages(
        torch.tensor([1.0, 0.0]), node, mask, torch.tensor([0.5, 0.5]), torch.ones(2),
        norm_by_std=False, eps=1e-6,
    )  # fmt: skip
    # V(7) = 1/2 - mean 1/2 = 0; node 8 is 7's only child: 0 too.
    assert adv.tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
