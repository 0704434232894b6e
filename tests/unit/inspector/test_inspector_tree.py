"""The inspector's tree of a tree rollout: values and advantages derived by hand, and the
trainer's own tree_grpo path agreeing with them."""

from __future__ import annotations

import pytest
import torch

from agentrl.inspector.tree import TreeError, TreeSettings, group_tree, tree_settings
from agentrl.models.tokenizer import build_tokenizer
from agentrl.trainer.algo.advantages import AdvantageInputs, compute_advantages
from agentrl.trainer.engine.batch import build_batch
from tests.helpers.tree_runs import TREE_CONFIG, tree_group, tree_leaf

NO_STD = TreeSettings(norm_by_std=False)
ORDER = ["0", "0.0", "0.0.0", "0.0.1", "0.1", "0.1.0", "0.1.1"]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(0)


def _by_id(view):
    return {n["id"]: n for n in view["nodes"]}


def test_2x2_tree_by_hand(tok):
    # R = 1, 0, 0, 0. V(0) = 1/4, V(0.0) = 1/2, V(0.1) = 0, a leaf's V is its R.
    # Â: "0" is the group's child: V - mean = 0; a deeper node: V(n) - V(parent).
    view = group_tree(tree_group(tok), settings=NO_STD)
    nodes = _by_id(view)
    assert [n["id"] for n in view["nodes"]] == ORDER
    want = {
        "0": (None, 0, 0.25, 0.0, [0, 1, 2, 3]),
        "0.0": ("0", 1, 0.5, 0.25, [0, 1]),
        "0.0.0": ("0.0", 2, 1.0, 0.5, [0]),
        "0.0.1": ("0.0", 2, 0.0, -0.5, [1]),
        "0.1": ("0", 1, 0.0, -0.25, [2, 3]),
        "0.1.0": ("0.1", 2, 0.0, 0.0, [2]),
        "0.1.1": ("0.1", 2, 0.0, 0.0, [3]),
    }
    got = {
        k: (n["parent"], n["depth"], n["value"], n["advantage"], n["leaves"])
        for k, n in nodes.items()
    }
    assert got == want
    assert nodes["0"]["children"] == ["0.0", "0.1"] and all(n["choice"] for n in view["nodes"])
    assert view["group"] == {"mean": 0.25, "std": 0.5, "trained_leaves": 4}
    leaves = view["leaves"]
    assert [x["turn_advantages"] for x in leaves] == [
        [0.0, 0.25, 0.5],
        [0.0, 0.25, -0.5],
        [0.0, -0.25, 0.0],
        [0.0, -0.25, 0.0],
    ]
    assert [(x["episode_id"], x["outcome"], x["stop_reason"], x["path"]) for x in leaves][2] == (
        "g1/2",
        0.0,
        "max_tokens",
        ["0", "0.1", "0.1.0"],
    )
    # The node's turns: its text (no tokenizer: the assistant message) at its turn index.
    assert nodes["0.1"]["turns"] == [{"turn": 1, "text": "step 0.1", "after": ""}]


def test_norm_by_std_and_decoded_turns(tok):
    view = group_tree(
        tree_group(tok), settings=TreeSettings(norm_by_std=True, eps=1e-6), decode=_decode(tok)
    )
    nodes = _by_id(view)
    s = 0.5 + 1e-6  # the group's std (Bessel) + eps
    assert nodes["0.0"]["advantage"] == pytest.approx(0.25 / s)
    assert nodes["0.0.1"]["advantage"] == pytest.approx(-0.5 / s)
    assert view["leaves"][0]["turn_advantages"] == pytest.approx([0.0, 0.25 / s, 0.5 / s])
    assert nodes["0.1"]["turns"] == [{"turn": 1, "text": " step 0.1", "after": " seen 0.1"}]
    assert nodes["0.1.0"]["turns"][0]["after"] == ""  # the leaf's last turn


def _decode(tok):
    return lambda ids: [tok.decode([i]) for i in ids]


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_matches_the_trainers_tree_grpo(tok, norm, gamma):
    # What the trainer gives each model token, through build_batch and compute_advantages.
    leaves = tree_group(tok, rewards=[1.0, 0.0, 0.5, 0.0])
    batch = build_batch(leaves, [t.reward for t in leaves], [False] * 4)
    inputs = AdvantageInputs(
        batch.rewards_BR, batch.mask_BR, batch.turn_BR, batch.group_B, gamma=gamma,
        norm_by_std=norm, eps=1e-6, node_BR=batch.node_BR,
    )  # fmt: skip
    adv_BR, _ = compute_advantages("tree_grpo", inputs)
    view = group_tree(leaves, settings=TreeSettings(norm_by_std=norm, gamma=gamma))
    for b, leaf in enumerate(view["leaves"]):
        per_token = adv_BR[b][batch.mask_BR[b] > 0]
        turns = batch.turn_BR[b][batch.mask_BR[b] > 0]
        trainer = [float(per_token[turns == k][0]) for k in range(int(turns.max()) + 1)]
        assert leaf["turn_advantages"] == pytest.approx(trainer, abs=1e-6)
    assert torch.count_nonzero(adv_BR) > 0


def test_only_child_takes_its_parents_advantage(tok):
    # Root children "0" (R 1, 0) and "1" (R 0): mean 1/3. "0.0" is "0"'s only child, "1.0" "1"'s.
    leaves = [
        tree_leaf(tok, ["0", "0.0", "0.0.0"], 1.0, k=0),
        tree_leaf(tok, ["0", "0.0", "0.0.1"], 0.0, k=1),
        tree_leaf(tok, ["1", "1.0"], 0.0, k=2),
    ]
    nodes = _by_id(group_tree(leaves, settings=NO_STD))
    assert nodes["0"]["advantage"] == pytest.approx(0.5 - 1 / 3)
    assert nodes["0.0"]["advantage"] == pytest.approx(0.5 - 1 / 3) and not nodes["0.0"]["choice"]
    assert (nodes["0.0.0"]["advantage"], nodes["0.0.1"]["advantage"]) == (0.5, -0.5)
    assert nodes["1.0"]["advantage"] == pytest.approx(-1 / 3) and not nodes["1.0"]["choice"]


def test_outcomes_discount_and_episodes_outside_the_tree(tok):
    leaves = [*tree_group(tok)[:2], tree_leaf(tok, ["p"], 0.0, k=9, tree=False)]
    view = group_tree(
        leaves, outcomes=[2.0, 0.0, 0.0], settings=TreeSettings(norm_by_std=False, gamma=0.5)
    )
    nodes = _by_id(view)
    # mean 2/3; "0" (R 2, 0): V 1, Â 1/3; "0.0" only child; leaves ±1; the plain episode -2/3.
    assert nodes["episode g1/9"]["parent"] is None and nodes["episode g1/9"]["value"] == 0.0
    assert nodes["episode g1/9"]["advantage"] == pytest.approx(-2 / 3)
    assert view["leaves"][0]["turn_advantages"] == pytest.approx([0.25 / 3, 0.5 / 3, 1.0])


def test_bad_tree_data_is_a_clear_error(tok):
    short = tree_leaf(tok, ["0", "0.0", "0.0.0"], 1.0)
    short.info["tree"]["node_ids"] = ["0", "0.0"]
    with pytest.raises(TreeError, match=r"2 ids for 3 model turns"):
        group_tree([short])
    two_parents = [tree_leaf(tok, ["a", "x"], 1.0, k=0), tree_leaf(tok, ["b", "x"], 0.0, k=1)]
    with pytest.raises(TreeError, match=r"node 'x' has two parents: 'a' \(episode g1/0\) and 'b'"):
        group_tree(two_parents)
    with pytest.raises(TreeError, match="returns to node 'a'"):
        group_tree([tree_leaf(tok, ["a", "b", "a"], 1.0)])


def test_settings_from_the_run_config():
    s = tree_settings(TREE_CONFIG)
    assert (s.norm_by_std, s.eps, s.gamma, s.estimator) == (True, 1e-6, 1.0, "tree_grpo")
    assert "config.yaml" in s.source
    off = tree_settings(TREE_CONFIG.replace("norm_by_std: true", "norm_by_std: false"))
    assert off.norm_by_std is False
    assert tree_settings(None).source.startswith("defaults: the run directory has no config")
    assert "no trainer.advantage" in tree_settings("model: {}\n").source
    assert tree_settings(None).norm_by_std is True
