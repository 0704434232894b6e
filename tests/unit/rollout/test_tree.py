"""Tree rollouts: leaves, node ids, exact records, failed forks, env lifecycles, pruning."""

from __future__ import annotations

import copy
import itertools
from dataclasses import replace
from typing import Any, ClassVar

import pytest
import torch

from agentrl import Env, Message, StepResult, StopReason
from agentrl.rollout import AgentLoop, LoopConfig, RolloutRunner, TreeSampler, TreeSpec
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy
from agentrl.trainer.algo.tree import tree_advantages
from agentrl.trainer.engine.tree_nodes import node_BR


class Moves(Env):
    """Three turns of 'moves'; reward 1 when the last move's number is odd. Pure Python
    state, so the default fork (a deep copy) works; every env made and closed is counted."""

    made: ClassVar[list[int]] = []
    closed: ClassVar[list[int]] = []
    ids = itertools.count()
    turns = 3
    fail_fork: str | None = None

    def __init__(self) -> None:
        self.uid = next(Moves.ids)
        Moves.made.append(self.uid)
        self.moves: list[str] = []

    def reset(self, task, *, seed=None):
        return f"play {task['id']}"

    def step(self, action):
        self.moves.append(action.text)
        if len(self.moves) < self.turns:
            return StepResult(observation=[Message.user(f"ok {len(self.moves)}")])
        last = int(action.text.split()[-1])
        return StepResult(reward=float(last % 2), terminated=True)

    def fork(self):
        if Moves.fail_fork == "raise":
            Moves.fail_fork = None  # the first fork fails, the later ones work
            raise OSError("no room for a copy")
        if Moves.fail_fork == "self":
            Moves.fail_fork = None
            return self
        child = copy.deepcopy(self)
        child.uid = next(Moves.ids)
        Moves.made.append(child.uid)
        return child

    def close(self):
        Moves.closed.append(self.uid)


@pytest.fixture(autouse=True)
def _reset_moves():
    Moves.made, Moves.closed, Moves.turns, Moves.fail_fork = [], [], 3, None
    yield


class Recording(ScriptedLLM):
    """Replies 'move N' with N counting up (so branches differ); records session ids;
    ``surprise(turn)`` sets the logprob of every token of a turn to -surprise."""

    def __init__(self, tokenizer: Any, surprise: Any = None) -> None:
        n = itertools.count()
        super().__init__(TextPolicy(tokenizer, lambda _: f"move {next(n)}"))
        self.tokenizer = tokenizer
        self.sessions: list[str | None] = []
        self.surprise = surprise

    async def generate(self, prompt_ids, params, *, session_id=None):
        self.sessions.append(session_id)
        gen = await super().generate(prompt_ids, params, session_id=session_id)
        if self.surprise is not None:
            turn = self.tokenizer.decode(prompt_ids).count("move ")
            gen = replace(gen, logprobs=[-float(self.surprise(turn))] * len(gen.token_ids))
        return gen


def _loop(llm: Any, tokenizer: Any, **kw: Any) -> AgentLoop:
    return AgentLoop(llm, tokenizer, LoopConfig(max_turns=kw.pop("max_turns", 4), **kw))


def _model_spans(t):
    return [s for s in t.spans if s.kind == "model"]


async def test_leaves_share_their_prefix_exactly_and_name_their_nodes(tokenizer):
    llm = Recording(tokenizer)
    sampler = TreeSampler(_loop(llm, tokenizer), TreeSpec(width=2, max_leaves=4))
    leaves = await sampler.group(Moves, {"id": "t"}, group_id="g", leaves=4, seed=0)

    assert [t.info["tree"]["leaf"] for t in leaves] == ["0.0.0", "0.0.1", "0.1.0", "0.1.1"]
    assert [t.info["tree"]["node_ids"] for t in leaves] == [
        ["0", "0.0", "0.0.0"], ["0", "0.0", "0.0.1"], ["0", "0.1", "0.1.0"], ["0", "0.1", "0.1.1"]
    ]  # fmt: skip
    assert leaves[3].info["tree"]["parent"] == "0.1"
    assert all(t.info["tree"]["branch_turns"] == [1, 2] for t in leaves)
    assert len({t.episode_id for t in leaves}) == 4 and leaves[0].episode_id == "g/0.0.0"
    # Every request of the tree went to the root's session (one server, its prefix cache).
    assert set(llm.sessions) == {"g/0"}
    # 1 + 2 + 4 model turns generated for 4 leaves of 3 turns each.
    assert len(llm.requests) == 7
    assert all(t.stop_reason == StopReason.DONE and t.num_turns == 3 for t in leaves)
    fields = ("token_ids", "loss_mask", "rollout_logprobs", "weight_versions")
    for a, b in itertools.combinations(leaves, 2):
        common = len(_common_nodes(a, b))
        # Leaves share exactly the tokens up to where their paths part, then differ.
        cut = _model_spans(a)[common].start
        for f in fields:
            assert getattr(a, f)[:cut] == getattr(b, f)[:cut], f
        assert a.token_ids[cut:] != b.token_ids[cut:]
    for t in leaves:  # each leaf is an ordinary, self-consistent record
        n = len(t.token_ids)
        assert len(t.loss_mask) == len(t.rollout_logprobs) == len(t.weight_versions) == n
        for s in _model_spans(t):
            assert all(t.loss_mask[s.start : s.end]) and t.weight_versions[s.start] == 0
        assert sum(t.loss_mask) == t.num_model_tokens
        assert t.metrics["tree_shared_prefix_tokens"] == _model_spans(t)[2].start
    # Each turn generated once: the leaves' own tokens add up to the tree's tokens.
    own = sum(t.metrics["tree_generated_tokens"] for t in leaves)
    assert own == sum(len(g) for g in _unique_turns(leaves))
    assert sorted(Moves.closed) == sorted(Moves.made) and len(Moves.made) == 4


def _common_nodes(a, b):
    ia, ib = a.info["tree"]["node_ids"], b.info["tree"]["node_ids"]
    return [x for x, y in zip(ia, ib, strict=False) if x == y]


def _unique_turns(leaves):
    seen = {}
    for t in leaves:
        for node, s in zip(t.info["tree"]["node_ids"], _model_spans(t), strict=True):
            seen[node] = t.token_ids[s.start : s.end]
    return list(seen.values())


async def test_leaves_round_trip_through_tree_grpo(tokenizer):
    sampler = TreeSampler(_loop(Recording(tokenizer), tokenizer), TreeSpec(width=2, max_leaves=4))
    leaves = await sampler.group(Moves, {"id": "t"}, group_id="g", leaves=8, seed=0)
    assert len(leaves) == 8 and {t.info["tree"]["root"] for t in leaves} == {"0", "1"}
    positions = [[i for i, m in enumerate(t.loss_mask) if m] for t in leaves]
    R = max(map(len, positions))
    nodes = node_BR(leaves, positions, R)
    assert nodes is not None
    mask = torch.zeros(len(leaves), R)
    for b, p in enumerate(positions):
        mask[b, : len(p)] = 1
    outcome = torch.tensor([t.reward for t in leaves])
    mean, std = outcome.mean().expand(8), outcome.std().expand(8)
    adv = tree_advantages(outcome, nodes, mask, mean, std, norm_by_std=False, eps=1e-6)
    for root in ("0", "1"):  # a shared turn is one node, with one advantage, in every leaf
        rows = [b for b, t in enumerate(leaves) if t.info["tree"]["root"] == root]
        first = {int(nodes[b, 0]) for b in rows}
        assert len(first) == 1
        assert len({float(adv[b, 0]) for b in rows}) == 1
    # Siblings under one branch point get their own outcome against their parent's mean.
    a, b = leaves[0], leaves[1]  # 0.0.0 and 0.0.1
    last = len(positions[0]) - 1
    assert float(adv[0, last] - adv[1, len(positions[1]) - 1]) == pytest.approx(a.reward - b.reward)


async def test_a_failing_fork_ends_that_branch_with_its_reason(tokenizer):
    Moves.fail_fork = "raise"
    sampler = TreeSampler(_loop(Recording(tokenizer), tokenizer), TreeSpec(width=2, max_leaves=4))
    leaves = await sampler.group(Moves, {"id": "t"}, group_id="g", leaves=4, seed=0)

    failed = [t for t in leaves if t.stop_reason == StopReason.ENV_ERROR]
    assert len(failed) == 1
    assert "env.fork failed at turn 1: OSError: no room for a copy" in failed[0].error
    assert failed[0].info["tree"]["node_ids"] == ["0"] and failed[0].num_turns == 1
    # The group keeps its size: the branch's unspent leaf went to a new root.
    assert len(leaves) == 4 and sum(t.stop_reason == StopReason.DONE for t in leaves) == 3
    assert sorted(Moves.closed) == sorted(Moves.made)  # every env closed exactly once


async def test_a_fork_that_returns_the_same_env_is_refused(tokenizer):
    Moves.fail_fork = "self"
    sampler = TreeSampler(_loop(Recording(tokenizer), tokenizer), TreeSpec(width=2, max_leaves=2))
    leaves = await sampler.group(Moves, {"id": "t"}, group_id="g", leaves=2, seed=0)
    failed = [t for t in leaves if t.stop_reason == StopReason.ENV_ERROR]
    assert len(failed) == 1 and "cannot share one env" in failed[0].error
    assert sorted(Moves.closed) == sorted(Moves.made)
    assert len(Moves.closed) == len(set(Moves.closed))


async def test_width_one_is_ordinary_episodes(tokenizer):
    def policy():
        return ScriptedLLM(TextPolicy(tokenizer, lambda p: f"move {p.count('ok') + 1}"))

    sampler = TreeSampler(_loop(policy(), tokenizer), TreeSpec(width=1, max_leaves=1))
    leaves = await sampler.group(Moves, {"id": "t"}, group_id="g", leaves=3, seed=5)
    loop = _loop(policy(), tokenizer)
    flat = [await loop.run(Moves(), {"id": "t"}, seed=5 + k) for k in range(3)]
    assert len(leaves) == 3
    for t, f in zip(leaves, flat, strict=True):
        for name in ("token_ids", "loss_mask", "rollout_logprobs", "weight_versions", "reward"):
            assert getattr(t, name) == getattr(f, name), name
        assert t.stop_reason == f.stop_reason == StopReason.DONE
        assert t.info["tree"]["branch_turns"] == [] and len(t.info["tree"]["node_ids"]) == 3


async def test_the_token_budget_prunes_branches_never_a_turn(tokenizer):
    sampler = TreeSampler(
        _loop(Recording(tokenizer), tokenizer), TreeSpec(width=2, max_leaves=4, max_tree_tokens=1)
    )
    leaves = await sampler.group(Moves, {"id": "t"}, group_id="g", leaves=4, seed=0)
    # The first turn spent the budget: the tree never branched and its other leaves are pruned.
    assert len(leaves) == 1
    (t,) = leaves
    assert t.stop_reason == StopReason.DONE and t.num_turns == 3
    eos = tokenizer.eos_token_id
    assert all(t.token_ids[s.end - 1] == eos for s in _model_spans(t))  # whole turns only


async def test_a_branch_that_ends_early_hands_its_leaves_to_new_roots(tokenizer):
    Moves.turns = 1  # every episode ends after its first turn: no branch point is reached
    llm = Recording(tokenizer)
    sampler = TreeSampler(_loop(llm, tokenizer), TreeSpec(width=2, max_leaves=4))
    leaves = await sampler.group(Moves, {"id": "t"}, group_id="g", leaves=4, seed=0)
    assert len(leaves) == 4
    assert [t.info["tree"]["root"] for t in leaves] == ["0", "1", "2", "3"]
    assert len(set(llm.sessions)) == 4


async def test_entropy_branches_after_the_most_uncertain_turn(tokenizer):
    Moves.turns = 4
    llm = Recording(tokenizer, surprise=lambda turn: [1.0, 3.0, 2.0, 1.0][turn])
    spec = TreeSpec(branch_at="entropy", width=2, max_leaves=4)
    leaves = await TreeSampler(_loop(llm, tokenizer), spec).group(
        Moves, {"id": "t"}, group_id="g", leaves=4, seed=0
    )
    # Turn 1 was more uncertain than turn 0: branch before turn 2; then before the last.
    assert {tuple(t.info["tree"]["branch_turns"]) for t in leaves} == {(2, 3)}
    turns = await TreeSampler(
        _loop(Recording(tokenizer), tokenizer), replace(spec, branch_at="turns")
    ).group(Moves, {"id": "t"}, group_id="g", leaves=4, seed=0)
    assert {tuple(t.info["tree"]["branch_turns"]) for t in turns} == {(1, 2)}


async def test_the_runner_samples_groups_as_trees(tokenizer):
    runner = RolloutRunner(
        _loop(Recording(tokenizer), tokenizer), Moves, group_size=4,
        tree=TreeSpec(width=2, max_leaves=4),
    )  # fmt: skip
    result = await runner.run([{"id": "a"}, {"id": "b"}])
    assert [len(g) for g in result.groups] == [4, 4]
    assert all("tree" in t.info for t in result.trajectories)
    # 7 turns generated for 4 leaves of 3 turns: 7/12 of independent episodes' tokens.
    per_leaf = result.metrics["tree/generated_tokens_per_leaf"]
    assert per_leaf == pytest.approx(result.metrics["model_tokens_total"] / 8 * 7 / 12, rel=0.2)


def test_spec_validation():
    with pytest.raises(ValueError, match="branch_at"):
        TreeSpec(branch_at="leaves")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="width and max_leaves"):
        TreeSpec(width=0)
