"""The training driver: sync, one-step-off and fully-async interleaving of generation and training.

* ``sync``: generate a batch, train on it, push the weights; repeat.
* ``one_step_off``: generate batch n+1 (with the weights of step n-1) while
  training on batch n; push the weights between batches.
* ``fully_async``: a producer keeps episodes running and puts finished groups in
  a bounded buffer; the trainer takes a batch when enough is there, in the order
  groups finish. The producer may not start a group more than ``max_staleness``
  weight versions ahead of the step that trains it (a bound on starts, as AReaL's
  ``max_head_offpolicyness``): a straggler finishing after later groups is trained
  later and lags more, which ``staleness/max`` reports. With ``partial_rollout`` a
  weight sync freezes in-flight requests (pause mode ``keep``) and they continue on
  the new weights; every token records the version that produced it. With
  ``overlap_push`` the trainer snapshots its weights and trains on the next batch
  while the servers load them (AReaL's decoupled weight update); a group still
  starts only within ``max_staleness`` of the weights the servers hold. When every
  group the bound lets start was dropped (every episode broke), the step trains on
  what it kept, perhaps nothing, rather than wait for a group that cannot start.

Nothing is dropped silently: every discarded episode or group is counted with
its reason in the step's metrics (``discard/<reason>``), a step records how many
episodes it generated and how many of them broke (``episodes/generated``,
``episodes/discarded``), and the broken episodes themselves travel with the step
(:attr:`StepOutput.discarded`, saved with their errors in ``RUN_DIR/discarded/``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrl.config import OrchestrationConfig
from agentrl.inference.weight_sync import PauseMode, SyncReport
from agentrl.orchestration.tasks import TaskStream
from agentrl.rewards import reward_model_metrics
from agentrl.types import Trajectory

__all__ = ["Discarded", "Driver", "GroupRunner", "StepOutput", "TrainerLike", "select_groups"]

Discarded = tuple[str, Trajectory]
"""An episode discarded for its own sake: (reason, episode). The reason is its stop reason
(``agent_error``, ``env_error``, ``llm_error`` …; the traceback is in ``error``) or
``no_model_tokens``."""


class GroupRunner(Protocol):
    """What the driver needs of a rollout side (a RolloutRunner, or Ray rollout workers)."""

    group_size: int

    async def run_group(
        self, task: Any, *, index: int, seed: int | None = 0, tag: str = ""
    ) -> list[Trajectory]: ...


class TrainerLike(Protocol):
    """What the driver needs of a trainer."""

    def step(self, trajectories: list[Trajectory]) -> dict[str, float]: ...

    def state_dict_for_inference(self) -> Any:
        """The weights as the run's push takes them: a state dict, a directory of
        safetensors (a trainer process) or a handle (Ray's object store)."""
        ...


SyncWeights = Callable[[Any, PauseMode], Awaitable[int | SyncReport]]
"""``await sync(weights, pause_mode)`` -> the new weight version, or the sync's report
(its size is then in each step's metrics as ``sync/bytes``)."""


def select_groups(
    groups: Sequence[list[Trajectory]],
    *,
    dynamic_filter: bool,
    min_group: int = 1,
    discarded: list[Discarded] | None = None,
) -> tuple[list[list[Trajectory]], Counter[str]]:
    """Drops untrainable episodes and (optionally) uninformative groups, counting why.

    Args:
        discarded: When given, each episode dropped for its own sake (a failure stop
            reason, or no model token) is appended to it with its reason.

    Returns:
        The kept groups and a counter of ``episode:<stop reason>`` and ``group:<reason>``.
    """
    kept: list[list[Trajectory]] = []
    why: Counter[str] = Counter()
    for g in groups:
        ok = []
        for t in g:
            if t.stop_reason.is_failure:
                reason = str(t.stop_reason)
            elif not t.num_model_tokens:
                reason = "no_model_tokens"  # e.g. the prompt alone filled the context
            else:
                ok.append(t)
                continue
            why[f"episode:{reason}"] += 1
            if discarded is not None:
                discarded.append((reason, t))
        if len(ok) < min_group or not ok:
            why["group:too_few_episodes"] += 1
            continue
        if dynamic_filter and len({t.reward for t in ok}) == 1:
            why["group:zero_reward_std"] += 1
            continue
        kept.append(ok)
    return kept, why


@dataclass
class StepOutput:
    """One training step's data and numbers.

    Attributes:
        step: The step number (1-based, continuous across a resume).
        trajectories: The episodes trained on.
        metrics: The step's numbers.
        tasks: Task-stream indices consumed by the step (trained or discarded).
        discarded: The episodes the step generated and dropped for their own sake, with
            the reason (see :data:`Discarded`), in the order they were taken.
    """

    step: int
    trajectories: list[Trajectory]
    metrics: dict[str, float] = field(default_factory=dict)
    tasks: list[int] = field(default_factory=list)
    discarded: list[Discarded] = field(default_factory=list)


_EMPTY_BATCH_PREFIXES = ("reward/", "response/")
"""Statistics of the trained batch that mean nothing when it is empty (a trainer reports
``reward/mean`` 0.0 for no episode): left out of such a step's metrics."""


@dataclass
class _Taken:
    """What a step took from generation: kept groups, consumed task indices, why the
    rest was dropped, the dropped episodes and how many episodes there were."""

    groups: list[list[Trajectory]] = field(default_factory=list)
    used: list[int] = field(default_factory=list)
    why: Counter[str] = field(default_factory=Counter)
    discarded: list[Discarded] = field(default_factory=list)
    generated: int = 0

    def add(
        self, groups: Sequence[list[Trajectory]], *, dynamic_filter: bool, min_group: int
    ) -> int:
        """Selects from ``groups``; returns how many groups were kept."""
        k, w = select_groups(
            groups, dynamic_filter=dynamic_filter, min_group=min_group, discarded=self.discarded
        )
        self.groups += k
        self.why += w
        self.generated += sum(len(g) for g in groups)
        return len(k)


class Driver:
    """Runs training steps in one of the three modes.

    Args:
        runner: Runs the G episodes of a task.
        trainer: Updates the policy on a batch of trajectories.
        sync_weights: Pushes weights to the inference servers, returns the new version.
        stream: Where tasks come from (resumable).
        config: Mode and its knobs.
        tasks_per_step: Groups per training step.
        seed: Base seed of episode sampling.
        stop: When set, the driver finishes the current step and returns.
    """

    def __init__(
        self,
        runner: GroupRunner,
        trainer: TrainerLike,
        sync_weights: SyncWeights,
        stream: TaskStream,
        config: OrchestrationConfig,
        *,
        tasks_per_step: int,
        seed: int = 0,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.runner = runner
        self.trainer = trainer
        self.sync_weights = sync_weights
        self.stream = stream
        self.config = config
        self.tasks_per_step = tasks_per_step
        self.seed = seed
        self.stop = stop or asyncio.Event()
        self.version = 0
        self.sync_bytes = 0  # size of the last push, when the push reports it
        self.step = 0
        self.training = False
        """True while the trainer updates: its state is then neither step's (not saved)."""
        self.unreported: StepOutput | None = None
        """A step trained and committed whose weight push has not finished (see _commit)."""
        self._min_group = 2 if runner.group_size > 1 else 1
        self._background: asyncio.Task[float] | None = None
        """fully_async with ``overlap_push``: the last step's push, still running."""

    # ------------------------------------------------------------------ shared pieces

    async def _group(self, index: int, task: Any) -> list[Trajectory]:
        return await self.runner.run_group(
            task, index=index, seed=self.seed * 1_000_003 + index * 97, tag=f"i{index}"
        )

    async def _collect(self) -> tuple[_Taken, float]:
        """Generates until ``tasks_per_step`` kept groups (oversampling, bounded rounds)."""
        t0 = time.perf_counter()
        taken = _Taken()
        n = math.ceil(self.tasks_per_step * self.config.oversample)
        for _ in range(4):
            batch = self.stream.take(n)
            taken.used += [i for i, _ in batch]
            groups = await asyncio.gather(*(self._group(i, t) for i, t in batch))
            taken.add(groups, dynamic_filter=self.config.dynamic_filter, min_group=self._min_group)
            if len(taken.groups) >= self.tasks_per_step or not self.config.dynamic_filter:
                break
            n = self.tasks_per_step - len(taken.groups)
        if len(taken.groups) > self.tasks_per_step:
            taken.why["group:surplus"] += len(taken.groups) - self.tasks_per_step
            taken.groups = taken.groups[: self.tasks_per_step]
        return taken, time.perf_counter() - t0

    async def _train(self, groups: list[list[Trajectory]]) -> tuple[dict[str, float], float]:
        t0 = time.perf_counter()
        trajs = [t for g in groups for t in g]
        self.training = True
        # Called with an empty batch too: the trainer counts the step (``step/skipped``),
        # so its step number and the run's stay equal (checkpoints are named by it).
        metrics = await asyncio.to_thread(self.trainer.step, trajs)
        self.training = False
        return dict(metrics), time.perf_counter() - t0

    async def _push(self, mode: PauseMode) -> float:
        t0 = time.perf_counter()
        weights = await asyncio.to_thread(self.trainer.state_dict_for_inference)
        self.version = self.record_sync(await self.sync_weights(weights, mode))
        return time.perf_counter() - t0

    async def _start_push(
        self, mode: PauseMode, pushed: Callable[[], Awaitable[None]]
    ) -> tuple[float, float]:
        """Snapshots the weights and pushes them in the background (``overlap_push``).

        Waits for the previous background push first (one push at a time; its failure
        is raised here). ``pushed`` runs once the servers hold the new weights.

        Returns:
            Seconds the caller was held (the wait plus the snapshot) and the wall time
            of the previous push (0 when there was none).
        """
        t0 = time.perf_counter()
        previous = await self.settle()
        weights = await asyncio.to_thread(self.trainer.state_dict_for_inference)

        async def push() -> float:
            t = time.perf_counter()
            self.version = self.record_sync(await self.sync_weights(weights, mode))
            await pushed()
            return time.perf_counter() - t

        self._background = asyncio.create_task(push())
        return time.perf_counter() - t0, previous

    async def settle(self) -> float:
        """Waits for a weight push still running in the background; returns its wall time.

        After it, the servers hold the weights of the last step the driver yielded
        (evaluate after it). Raises what the push raised; 0.0 when none was running.
        """
        task, self._background = self._background, None
        return 0.0 if task is None else await task

    async def _cancel_background(self) -> None:
        task, self._background = self._background, None
        if task is not None:
            task.cancel()  # (a no-op once done) the sync's own cleanup resumes the servers
            with contextlib.suppress(BaseException):
                await task

    def _commit(
        self, taken: _Taken, metrics: dict[str, float], times: dict[str, float]
    ) -> StepOutput:
        """Counts a trained step: its tasks are done and the step number moves, together.

        Called right after the trainer's update, before the weight push, so that the
        trainer state, the task stream and the step number always describe the same
        step (a crash checkpoint taken while the push fails is consistent). The step
        stays in :attr:`unreported` until :meth:`_output` finishes it.
        """
        self.stream.mark_done(taken.used)
        self.step += 1
        trained = [t for g in taken.groups for t in g]
        out = dict(metrics)
        if not trained:  # nothing was trained on: no batch statistics
            out = {k: v for k, v in out.items() if not k.startswith(_EMPTY_BATCH_PREFIXES)}
        out.update({f"discard/{k}": float(v) for k, v in taken.why.items()})
        out.update({f"time/{k}": v for k, v in times.items()})
        out["groups"] = float(len(taken.groups))
        out["episodes/generated"] = float(taken.generated)
        out["episodes/discarded"] = float(len(taken.discarded))
        self.unreported = StepOutput(
            self.step, trained, out, sorted(taken.used), list(taken.discarded)
        )
        return self.unreported

    def finish_unreported(self) -> StepOutput | None:
        """The committed step whose push failed, with its numbers completed (or None)."""
        out, self.unreported = self.unreported, None
        return None if out is None else self._output(out, {})

    def record_sync(self, result: int | SyncReport) -> int:
        """The version a push returned (its size kept for the metrics when it reports one)."""
        if isinstance(result, SyncReport):
            self.sync_bytes = result.num_bytes
            return result.version
        return result

    def _output(
        self, step: StepOutput, times: dict[str, float], version: int | None = None
    ) -> StepOutput:
        """Finishes a step's numbers; ``version``: the step's weight version (default: now)."""
        self.unreported = None
        trajs, out = step.trajectories, step.metrics
        out.update({f"time/{k}": v for k, v in times.items()})
        version = self.version if version is None else version
        out["weight_version"] = float(version)
        if self.sync_bytes:
            out["sync/bytes"] = float(self.sync_bytes)
        versions = [
            v for t in trajs for v, m in zip(t.weight_versions, t.loss_mask, strict=True) if m
        ]
        if versions:
            out["staleness/max"] = float(version - min(versions))
            out["staleness/mean"] = float(version - sum(versions) / len(versions))
        for key in ("tool_time_s", "generate_time_s", "env_time_s"):
            total = sum(t.metrics.get(key, 0.0) for t in trajs)
            out[f"episode_sum/{key}"] = total
        for key in sorted({k for t in trajs for k in t.metrics}):  # the env's own, e.g. swe_*
            values = [t.metrics[key] for t in trajs if key in t.metrics]
            out[f"episode_mean/{key}"] = sum(values) / len(values)
        out.update(reward_model_metrics(trajs))  # reward/rm_* when a reward model scored
        segments = sum(t.metrics.get("gateway/segments", 0.0) for t in trajs)
        if segments:  # bring-your-own agents: samples, and how many a rewritten history added
            out["gateway/segments"] = segments
            out["gateway/rewrites"] = sum(t.metrics.get("gateway/rewrites", 0.0) for t in trajs)
        return step

    # ------------------------------------------------------------------ modes

    async def run(self, steps: int) -> Any:
        """Yields a :class:`StepOutput` after each step until ``steps`` or ``stop``."""
        mode = self.config.mode
        if mode == "sync":
            return self._sync(steps)
        if mode == "one_step_off":
            return self._one_step_off(steps)
        return self._fully_async(steps)

    async def _sync(self, steps: int) -> Any:
        while self.step < steps and not self.stop.is_set():
            taken, t_gen = await self._collect()
            metrics, t_train = await self._train(taken.groups)
            done = self._commit(taken, metrics, {"generate": t_gen, "train": t_train})
            t_sync = await self._push("wait")
            yield self._output(done, {"sync": t_sync})

    async def _one_step_off(self, steps: int) -> Any:
        pending: asyncio.Task[Any] | None = asyncio.create_task(self._collect())
        trained = False
        try:
            while self.step < steps and not self.stop.is_set() and pending is not None:
                t0 = time.perf_counter()
                taken, t_gen = await pending
                t_wait = time.perf_counter() - t0
                t_sync = await self._push("wait") if trained else 0.0
                last = self.step + 1 >= steps
                pending = None if last else asyncio.create_task(self._collect())
                metrics, t_train = await self._train(taken.groups)
                trained = True
                times = {
                    "generate": t_gen,
                    "wait_generate": t_wait,
                    "train": t_train,
                    "sync": t_sync,
                }
                # The step's version is that of the weights its update makes (pushed when
                # the next batch is in, or after the last step), as in the other modes.
                done = self._commit(taken, metrics, times)
                yield self._output(done, {}, self.version + 1)
            if trained:
                await self._push("wait")
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending

    async def _fully_async(self, steps: int) -> Any:
        cfg = self.config
        buffer: asyncio.Queue[tuple[int, list[Trajectory]]] = asyncio.Queue(cfg.buffer_size)
        can_start = asyncio.Condition()
        started = 0
        first = self.step  # a resumed run starts counting here, on the checkpoint's weights
        pushed = self.step  # steps whose weights the servers hold
        needed = (steps - first) * self.tasks_per_step  # groups this run can still train
        dropped = 0  # groups taken from the buffer and not kept (each needs a replacement)
        in_flight: set[asyncio.Task[None]] = set()

        def allowed() -> bool:
            if started - dropped >= needed:  # no group the run would never train
                return False
            # At most (steps pushed in this run + 1 + max_staleness) batches started:
            # a group starts at most max_staleness versions before it is trained. Without
            # backfill, a waiting trainer's batch runs alone (nothing newer starts).
            # Counting pushed steps (not trained ones) keeps the bound while a push
            # overlaps the next step's training.
            trained = pushed - first
            ahead = 1 + (cfg.max_staleness if self.training or cfg.backfill == "always" else 0)
            return started < (trained + ahead) * self.tasks_per_step

        async def one(index: int, task: Any) -> None:
            group = await self._group(index, task)
            await buffer.put((index, group))

        async def produce() -> None:
            nonlocal started
            while True:
                async with can_start:
                    await can_start.wait_for(allowed)
                index, task = self.stream.next()
                started += 1
                t = asyncio.create_task(one(index, task))
                in_flight.add(t)
                t.add_done_callback(in_flight.discard)

        async def on_pushed() -> None:
            nonlocal pushed
            pushed += 1
            async with can_start:
                can_start.notify_all()

        producer = asyncio.create_task(produce())
        mode: PauseMode = "keep" if cfg.partial_rollout else "wait"
        try:
            while self.step < steps and not self.stop.is_set():
                t0 = time.perf_counter()
                taken = _Taken()
                while len(taken.groups) < self.tasks_per_step:
                    # (a finished group is in the buffer before its task leaves in_flight)
                    running = any(not t.done() for t in in_flight)
                    pushing = self._background is not None and not self._background.done()
                    if buffer.empty() and not running and not pushing and not allowed():
                        # Every group the staleness bound let start was dropped (e.g. every
                        # episode broke): none can come until this step trains and pushes,
                        # so it trains on what it kept (perhaps nothing) instead of waiting
                        # forever.
                        break
                    index, group = await buffer.get()
                    taken.used.append(index)
                    k = taken.add(
                        [group], dynamic_filter=cfg.dynamic_filter, min_group=self._min_group
                    )
                    if not k:
                        dropped += 1
                        async with can_start:
                            can_start.notify_all()
                t_wait = time.perf_counter() - t0
                self.training = True  # (as _train does) before newer groups may start
                if cfg.backfill == "while_training":
                    async with can_start:
                        can_start.notify_all()
                metrics, t_train = await self._train(taken.groups)
                times = {"wait_buffer": t_wait, "train": t_train}
                done = self._commit(taken, metrics, times)
                if cfg.overlap_push:
                    # Every push bumps the version by one: the step's version is known now.
                    t_sync, t_prev = await self._start_push(mode, on_pushed)
                    out = self._output(done, {"sync": t_sync}, self.version + 1)
                    if t_prev:  # the previous step's push, overlapped with this step
                        out.metrics["time/push_background"] = t_prev
                else:
                    t_sync = await self._push(mode)
                    out = self._output(done, {"sync": t_sync})
                    await on_pushed()
                out.metrics["buffer_groups"] = float(buffer.qsize())
                yield out
            await self.settle()  # the servers end on the last step's weights
        finally:
            await self._cancel_background()
            producer.cancel()
            for t in list(in_flight):
                t.cancel()
            await asyncio.gather(producer, *in_flight, return_exceptions=True)
            # Groups finished but not trained stay outstanding in the stream: a resumed
            # run hands their tasks out again.
