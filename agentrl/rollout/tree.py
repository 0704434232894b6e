"""Tree rollouts: a group's episodes as the leaves of trees that branch between turns.

A tree starts as one episode (a *root*). At a branch point — before a model turn — the
branch forks into children: each gets a deep copy of the record so far and its own env
(``await env.fork()``), then continues on its own; the parent goes on as the first child.
Every leaf is an ordinary, exactly recorded :class:`~agentrl.types.Trajectory` (its
tokens are its ancestors' tokens, then its own), with the tree in ``info["tree"]``::

    {"node_ids": ["0", "0.1", "0.1.0"],  # one node per model turn (tree_grpo reads it)
     "leaf": "0.1.0", "parent": "0.1", "root": "0", "branch_turns": [1, 2]}

Node ids show the path: root ``r``, its children ``r.0``, ``r.1``, … Turns that leaves
share carry the same id; a branch point starts a new id in each child.

Shape (:class:`TreeSpec`): each root is given ``max_leaves`` leaves to make. A branch
with q > 1 leaves to give branches into ``min(width, q)`` children and splits q among
them as evenly as possible; before the episode's last turn it branches into all q.
``branch_at="turns"`` branches at every turn boundary after the first turn (breadth
first); ``"entropy"`` only after a turn that was more uncertain than every earlier turn of
the branch since its last branch point, by the mean surprisal −log p of the turn's
sampled tokens (the only logprobs recorded: a proxy for the entropy), and before the last
turn. A branch that ends (answered, an error) with q > 1 leaves still to give hands the
q - 1 to new roots (fresh envs, as many as ``width`` at a time), so the group keeps its
size. Pruning: once a tree has generated ``max_tree_tokens`` model tokens, no branch of it
branches again and unspent leaves are dropped (the group is smaller); a turn in progress
always finishes — nothing is cut mid-turn.

Prefix cache: every branch of a tree sends the root's ``session_id``, so the router keeps
the whole tree on one server, whose prefix cache serves the shared prefix. Per leaf,
``metrics["tree_shared_prefix_tokens"]`` counts the tokens it shares with its siblings
(its record at its last branch point) and ``metrics["tree_generated_tokens"]`` the model
tokens generated for it alone (a shared turn is counted once, on the first child): their
sum over a group divided by its leaves is the generated tokens per leaf.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.env import Env, call_maybe_async
from agentrl.rollout.agent_loop import AgentLoop
from agentrl.rollout.episode import Episode, EpisodeEnd, EpisodeState
from agentrl.types import StopReason, Trajectory

__all__ = ["TreeSampler", "TreeSpec"]

BranchAt = Literal["turns", "entropy"]


@dataclass(frozen=True)
class TreeSpec:
    """The shape of the trees of a tree rollout (see the module docstring).

    Attributes:
        branch_at: "turns" (every turn boundary, breadth first) or "entropy" (after the
            most uncertain turn so far, by mean surprisal).
        width: Children per branch point; 1: no branching (each root is one episode).
        max_leaves: Leaves per tree (per root).
        max_tree_tokens: Once a tree has generated this many model tokens it no longer
            branches (None: no limit).
    """

    branch_at: BranchAt = "turns"
    width: int = 2
    max_leaves: int = 4
    max_tree_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.branch_at not in ("turns", "entropy"):
            raise ValueError(f"branch_at must be 'turns' or 'entropy', got {self.branch_at!r}")
        if self.width < 1 or self.max_leaves < 1:
            raise ValueError(
                f"width and max_leaves must be ≥ 1, got {self.width}, {self.max_leaves}"
            )
        if self.max_tree_tokens is not None and self.max_tree_tokens < 1:
            raise ValueError(f"max_tree_tokens must be ≥ 1 or None, got {self.max_tree_tokens}")


def split(n: int, k: int) -> list[int]:
    """``n`` leaves split into ``k`` shares as evenly as possible, larger first."""
    return [n // k + (i < n % k) for i in range(k)]


@dataclass
class _Tree:
    group_id: str
    root: str
    t0: float
    deadline: float
    tokens: int = 0


@dataclass
class _Branch:
    ep: Episode
    node: str
    parent: str | None = None
    turn_nodes: list[str] = field(default_factory=list)  # the node of each turn played
    branch_turns: list[int] = field(default_factory=list)
    surprisals: list[float] = field(default_factory=list)  # of the turns since the last branch
    generated: int = 0
    shared: int = 0


def _surprisal(traj: Trajectory) -> float:
    """Mean −log p of the last model turn's sampled tokens (0 for none)."""
    span = next((s for s in reversed(traj.spans) if s.kind == "model"), None)
    if span is None:
        return 0.0
    lps = [
        lp
        for lp, m in zip(
            traj.rollout_logprobs[span.start : span.end],
            traj.loss_mask[span.start : span.end],
            strict=True,
        )
        if m
    ]
    return -sum(lps) / len(lps) if lps else 0.0


class TreeSampler:
    """Samples one group as tree rollouts over an :class:`AgentLoop`.

    Args:
        loop: Runs the turns (``start_episode``, ``play_turn``, ``end_episode``).
        spec: The trees' shape.

    Example:
        >>> sampler = TreeSampler(loop, TreeSpec(width=2, max_leaves=4))  # doctest: +SKIP
        >>> leaves = await sampler.group(MyEnv, task, group_id="g", leaves=8)  # doctest: +SKIP
    """

    def __init__(self, loop: AgentLoop, spec: TreeSpec) -> None:
        self.loop = loop
        self.spec = spec

    async def group(
        self,
        env_factory: Callable[[], Env],
        task: Mapping[str, Any],
        *,
        task_id: str = "0",
        group_id: str = "0",
        leaves: int,
        seed: int | None = None,
        slot: Callable[[], contextlib.AbstractAsyncContextManager[Any]] | None = None,
    ) -> list[Trajectory]:
        """Runs trees until ``leaves`` leaves have ended (fewer where a budget pruned them).

        Roots get ``max_leaves`` each; root r resets with ``seed + r``. ``slot()`` is held
        by each tree while it runs (e.g. the runner's concurrency semaphore). Never raises
        for an episode; a cancellation closes every live env.
        """
        out: list[Trajectory] = []
        roots = 0

        def plant(tg: asyncio.TaskGroup, quotas: list[int]) -> None:
            nonlocal roots
            for q in quotas:
                r, roots = roots, roots + 1
                tg.create_task(root(tg, str(r), q, None if seed is None else seed + r))

        async def root(tg: asyncio.TaskGroup, r: str, quota: int, root_seed: int | None) -> None:
            async with slot() if slot is not None else contextlib.nullcontext():
                got, left = await self._root(
                    env_factory, task, task_id, group_id, r, quota, root_seed
                )
            out.extend(got)
            if left > 0:
                plant(tg, [q for q in split(left, min(self.spec.width, left)) if q])

        n = self.spec.max_leaves
        async with asyncio.TaskGroup() as tg:
            plant(tg, [n] * (leaves // n) + ([leaves % n] if leaves % n else []))
        return sorted(out, key=lambda t: [int(p) for p in t.info["tree"]["leaf"].split(".")])

    async def _root(
        self,
        env_factory: Callable[[], Env],
        task: Mapping[str, Any],
        task_id: str,
        group_id: str,
        r: str,
        quota: int,
        seed: int | None,
    ) -> tuple[list[Trajectory], int]:
        traj = Trajectory(task_id=task_id, group_id=group_id, episode_id=f"{group_id}/{r}")
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        tree = _Tree(group_id, r, t0, loop.time() + self.loop.config.episode_timeout_s)
        try:
            env = env_factory()
        except Exception as e:
            traj.stop_reason = StopReason.ENV_ERROR
            traj.error = f"env factory: {type(e).__name__}: {e}"
            return [self._label(tree, _Branch(Episode(traj, Env(), r), r))], quota - 1
        b = _Branch(Episode(traj, env, session_id=f"{group_id}/{r}"), r)
        try:
            async with asyncio.timeout_at(tree.deadline):
                await self.loop.start_episode(b.ep, task, seed)
        except BaseException as e:
            return [await self._end(tree, b, e)], quota - 1
        return await self._grow(tree, b, quota)

    def _fanout(self, tree: _Tree, b: _Branch, quota: int) -> int:
        s, ep = self.spec, b.ep
        if quota <= 1 or s.width <= 1 or ep.turn == 0 or ep.turn >= ep.max_turns:
            return 1
        if b.branch_turns and b.branch_turns[-1] == ep.turn:
            return 1  # each child plays a turn of its own before it branches again
        if self._pruned(tree):
            return 1
        if ep.turn == ep.max_turns - 1:
            return quota  # the last turn: every leaf still to give branches here
        if s.branch_at == "entropy":
            since = b.surprisals
            if len(since) < 2 or since[-1] <= max(since[:-1]):
                return 1
        return min(s.width, quota)

    def _pruned(self, tree: _Tree) -> bool:
        cap = self.spec.max_tree_tokens
        return cap is not None and tree.tokens >= cap

    async def _turn(self, tree: _Tree, b: _Branch) -> None:
        traj = b.ep.traj
        before = len(traj.token_ids)
        b.turn_nodes.append(b.node)
        try:
            await self.loop.play_turn(b.ep)
        finally:
            made = sum(traj.loss_mask[before:])
            b.generated += made
            tree.tokens += made
            del b.turn_nodes[b.ep.turn :]  # a turn that ended before its model tokens
        b.surprisals.append(_surprisal(traj))

    async def _grow(self, tree: _Tree, b: _Branch, quota: int) -> tuple[list[Trajectory], int]:
        """Runs ``b`` to its branch point or its end; returns its leaves and the leaves it
        could not make (for new roots)."""
        try:
            async with asyncio.timeout_at(tree.deadline):
                while (fan := self._fanout(tree, b, quota)) == 1:
                    await self._turn(tree, b)
        except BaseException as e:
            leaf = await self._end(tree, b, e)
            return [leaf], 0 if self._pruned(tree) else quota - 1
        shares = split(quota, fan)
        live: list[tuple[_Branch, int]] = []
        leaves: list[Trajectory] = []
        left = 0
        try:
            for k in range(1, fan):  # forked one at a time, before any child moves on
                child = await self._fork(tree, b, k)
                if isinstance(child, Trajectory):  # a failed fork: that branch ends here
                    leaves.append(child)
                    left += shares[k] - 1
                else:
                    live.append((child, shares[k]))
        except BaseException:  # cancelled mid-fork: close what is live, then go
            for c, _ in [*live, (b, 0)]:
                with contextlib.suppress(BaseException):
                    await self.loop.end_episode(c.ep, EpisodeEnd(StopReason.ABORTED), tree.t0)
            raise
        self._branch(b, 0)
        results = await asyncio.gather(
            *(self._grow(tree, c, q) for c, q in [(b, shares[0]), *live])
        )
        for made, lost in results:
            leaves.extend(made)
            left += lost
        return leaves, 0 if self._pruned(tree) else left

    @staticmethod
    def _branch(b: _Branch, k: int) -> None:
        """``b`` becomes child ``k`` of its current node."""
        b.parent, b.node = b.node, f"{b.node}.{k}"
        b.branch_turns.append(b.ep.turn)
        b.shared = len(b.ep.traj.token_ids)
        b.surprisals = []

    async def _fork(self, tree: _Tree, b: _Branch, k: int) -> _Branch | Trajectory:
        """Child ``k`` of ``b``'s node with its own env, or its leaf when the fork failed."""
        traj = copy.deepcopy(b.ep.traj)
        child = _Branch(
            dataclasses.replace(b.ep, traj=traj, env=Env()),
            b.node,
            b.parent,
            list(b.turn_nodes),
            list(b.branch_turns),
        )
        self._branch(child, k)
        child.parent = b.node
        try:
            async with asyncio.timeout_at(tree.deadline):
                env = await call_maybe_async(b.ep.env.fork)
            if env is b.ep.env:
                raise RuntimeError(
                    f"{type(env).__name__}.fork() returned the env itself: two branches "
                    "cannot share one env"
                )
        except Exception as e:
            traj.stop_reason = StopReason.ENV_ERROR
            traj.error = f"env.fork failed at turn {b.ep.turn}: {type(e).__name__}: {e}"
            return self._label(tree, child)
        child.ep.env = env
        try:
            self.loop.bind_tools(child.ep)
        except EpisodeEnd as e:
            await self.loop.end_episode(child.ep, e, tree.t0)
            return self._label(tree, child)
        return child

    async def _end(self, tree: _Tree, b: _Branch, exc: BaseException) -> Trajectory:
        await self.loop.end_episode(b.ep, exc, tree.t0)  # re-raises a cancellation
        return self._label(tree, b)

    def _label(self, tree: _Tree, b: _Branch) -> Trajectory:
        traj = b.ep.traj
        if traj.info.get("state") != str(EpisodeState.TERMINATED):  # ended without the loop
            traj.info["state"] = str(EpisodeState.TERMINATED)
            traj.metrics["episode_time_s"] = time.perf_counter() - tree.t0
            traj.reward = sum(s.reward for s in traj.spans)
        model = [s for s in traj.spans if s.kind == "model"]
        ids = [n for n, s in zip(b.turn_nodes, model, strict=False) if s.end > s.start]
        traj.episode_id = f"{tree.group_id}/{b.node}"
        traj.info["tree"] = {
            "node_ids": ids,
            "leaf": b.node,
            "parent": b.parent,
            "root": tree.root,
            "branch_turns": list(b.branch_turns),
        }
        traj.metrics["tree_shared_prefix_tokens"] = float(b.shared)
        traj.metrics["tree_generated_tokens"] = float(b.generated)
        return traj
