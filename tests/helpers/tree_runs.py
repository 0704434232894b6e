"""Leaves of a tree rollout, and a run directory holding them, for the inspector's tests.

The depth-2, width-2 tree: a shared first turn (node "0"), two branches ("0.0", "0.1"),
each branching again into two leaves: 4 leaves, one model turn per node.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.models.tokenizer import build_tokenizer
from agentrl.reporting.run_dir import RunDir
from agentrl.types import Message, StopReason, Trajectory, TurnSpan

PATHS_2x2 = [
    ["0", "0.0", "0.0.0"],
    ["0", "0.0", "0.0.1"],
    ["0", "0.1", "0.1.0"],
    ["0", "0.1", "0.1.1"],
]
REWARDS_2x2 = [1.0, 0.0, 0.0, 0.0]

TREE_CONFIG = """\
model:
  path: null
  tiny_seed: 0
trainer:
  advantage:
    estimator: tree_grpo
    norm_by_std: true
    eps: 1.0e-06
    gamma: 1.0
    whiten: null
  shaping:
    dynamic_filter: false
"""


def tree_leaf(
    tok,
    node_ids: list[str],
    reward: float,
    *,
    group_id: str = "g1",
    k: int = 0,
    stop: StopReason = StopReason.DONE,
    tree: bool = True,
) -> Trajectory:
    """A leaf whose model turn j says ``step <node_ids[j]>`` and is answered ``seen <id>``:
    leaves that share a node share its tokens, as a tree rollout's leaves do."""

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    tokens, mask = ids("task: count to three"), []
    mask = [0] * len(tokens)
    spans = [TurnSpan(0, len(tokens), "prompt")]
    messages = [Message.user("task: count to three")]
    for j, node in enumerate(node_ids):
        said = ids(f" step {node}")
        spans.append(TurnSpan(len(tokens), len(tokens) + len(said), "model"))
        tokens, mask = tokens + said, mask + [1] * len(said)
        messages.append(Message.assistant(f"step {node}"))
        if j + 1 < len(node_ids):
            seen = ids(f" seen {node}")
            spans.append(TurnSpan(len(tokens), len(tokens) + len(seen), "observation"))
            tokens, mask = tokens + seen, mask + [0] * len(seen)
            messages.append(Message.user(f"seen {node}"))
    spans[-1] = TurnSpan(spans[-1].start, spans[-1].end, "model", reward)
    return Trajectory(
        task_id="count/0",
        group_id=group_id,
        episode_id=f"{group_id}/{k}",
        token_ids=tokens,
        loss_mask=mask,
        rollout_logprobs=[-0.5 if m else 0.0 for m in mask],
        weight_versions=[0 if m else -1 for m in mask],
        prompt_length=spans[0].end,
        spans=spans,
        reward=reward,
        stop_reason=stop,
        messages=messages,
        num_turns=len(node_ids),
        info={"tree": {"node_ids": list(node_ids), "leaf": node_ids[-1]}} if tree else {},
    )


def tree_group(
    tok, *, group_id: str = "g1", rewards: list[float] | None = None
) -> list[Trajectory]:
    """The 4 leaves of the depth-2, width-2 tree (rewards 1, 0, 0, 0 unless given)."""
    rewards = REWARDS_2x2 if rewards is None else rewards
    stops = [StopReason.DONE, StopReason.DONE, StopReason.MAX_TOKENS, StopReason.DONE]
    return [
        tree_leaf(tok, p, r, group_id=group_id, k=k, stop=stops[k])
        for k, (p, r) in enumerate(zip(PATHS_2x2, rewards, strict=True))
    ]


def write_tree_run(path: Path) -> RunDir:
    """Step 1: the 2x2 tree (group g1, episodes 1-0..1-3), a tree whose node "x" has two
    parents (g2, 1-4..1-5) and a plain group (g3, 1-6..1-7)."""
    tok = build_tokenizer(0)
    broken = [
        tree_leaf(tok, ["a", "x"], 1.0, group_id="g2", k=0),
        tree_leaf(tok, ["b", "x"], 0.0, group_id="g2", k=1),
    ]
    plain = [
        tree_leaf(tok, ["p"], r, group_id="g3", k=k, tree=False) for k, r in enumerate([1.0, 0.0])
    ]
    run = RunDir(path)
    run.save_trajectories(1, [*tree_group(tok), *broken, *plain])
    run.log(1, {"reward/mean": 0.25})
    (path / "config.yaml").write_text(TREE_CONFIG)
    return run
