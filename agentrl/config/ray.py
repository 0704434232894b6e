"""``RayConfig``: where the components of a run go on a Ray cluster.

Pure pydantic (no ``ray`` import), so :mod:`agentrl.config` can hold it whether
or not the ``ray`` extra is installed. ``address: None`` (the default) means no
Ray: ``agentrl train`` runs everything in one process.

Each role (inference replicas, rollout workers, trainer workers) gets one
placement group with one bundle per actor; a bundle asks for the role's CPUs,
GPUs and custom resources, so an actor lands only on a node that advertises them
(``ray start --resources '{"inference": 1}'``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RayConfig", "RoleSpec"]

Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


class RoleSpec(BaseModel):
    """How many actors of one role, and what each needs."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    count: int = Field(1, ge=1, description="Actors of this role (one placement bundle each).")
    num_cpus: float = Field(1.0, ge=0, description="Logical CPUs each actor reserves.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs each actor reserves.")
    resources: dict[str, float] = Field(
        default_factory=dict,
        description='Custom Ray resources each actor reserves, e.g. {"inference": 1}; the '
        "actor is placed only on nodes that advertise them.",
    )
    strategy: Strategy = Field(
        "PACK",
        description="Placement-group strategy of this role's bundles: PACK (few nodes), "
        "SPREAD (many nodes), STRICT_PACK (one node), STRICT_SPREAD (one node each).",
    )

    def bundle(self) -> dict[str, float]:
        """The placement bundle of one actor of this role (zero amounts left out)."""
        out = {k: v for k, v in self.resources.items() if v > 0}
        if self.num_cpus > 0:
            out["CPU"] = self.num_cpus
        if self.num_gpus > 0:
            out["GPU"] = self.num_gpus
        return out


def _role(count: int, cpus: float, resource: str, strategy: Strategy) -> RoleSpec:
    return RoleSpec(count=count, num_cpus=cpus, resources={resource: 1.0}, strategy=strategy)


class RayConfig(BaseModel):
    """Running the components of a training run as Ray actors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    address: str | None = Field(
        None,
        description='Ray cluster to join ("auto", "ray://host:10001", "host:6379"), or '
        '"local" to start a Ray instance of its own; None: no Ray, everything runs in this '
        "process.",
    )
    namespace: str = Field("agentrl", description="Ray namespace of the run's actors.")
    inference: RoleSpec = Field(
        default_factory=lambda: _role(1, 1.0, "inference", "SPREAD"),
        description="vLLM replicas: one server per actor, launched on the actor's node. "
        "count here replaces inference.num_servers.",
    )
    rollout: RoleSpec = Field(
        default_factory=lambda: _role(1, 1.0, "rollout", "SPREAD"),
        description="Agent-loop workers: each runs many episodes at once (async actor).",
    )
    trainer: RoleSpec = Field(
        default_factory=lambda: _role(1, 1.0, "trainer", "PACK"),
        description="Trainer workers: count > 1 forms one torch.distributed group (FSDP2).",
    )
    placement_timeout_s: float = Field(
        300.0, gt=0, description="Seconds to wait for the cluster to grant a placement group."
    )
    call_timeout_s: float = Field(
        3600.0, gt=0, description="Seconds one remote call (trainer step, rollout group) may take."
    )
    replica_check_interval_s: float = Field(
        5.0,
        gt=0,
        description="Seconds between looks for returned capacity after an inference replica "
        "died (its node was lost): once Ray re-places its bundle on a node with the "
        "resources, a new replica starts there with the current weights.",
    )
    max_group_retries: int = Field(
        2, ge=0, description="Times a group is re-sent to another rollout worker that died."
    )
    object_store_memory: int | None = Field(
        None,
        ge=78_643_200,
        description="Object store bytes when this process starts a local Ray (address "
        '"local"); None: Ray\'s default.',
    )
