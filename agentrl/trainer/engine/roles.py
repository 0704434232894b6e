"""One LoRA policy per role (``trainer.lora.per_role``): adapters, masks and the forward.

An env that names roles (``Env.roles``, e.g. solver and checker) records the role of each
model turn (``TurnSpan.role``). Under ``per_role`` the policy's LM carries one peft
adapter per role over one shared, frozen base, and the optimizer holds them all.

The policy forward of a micro-batch runs once per role present in it, with that role's
adapter active over the whole sequence (as the server sampled that role's tokens), and
keeps each token's log-prob from its own role's pass::

    logp_t = Σ_k [role_t = k] · logp_t^(k)

so the loss (unchanged, normalized by the objective's usual token count) is the sum of
the roles' losses, each role's tokens credit only its own adapter, and the other role's
tokens are context. A role with no tokens in an optimizer step runs no training forward,
so it gets no gradient and AdamW leaves it as it is (no momentum or decay from a step it
took no part in). The reference policy
for KL stays the base with every adapter off.

Example:
    >>> cfg = TrainerConfig(lora={"per_role": True, "roles": ["solver", "checker"]})
    >>> trainer = Trainer(cfg, "path/to/model")  # doctest: +SKIP
    >>> trainer.adapter_states_for_inference().keys()  # doctest: +SKIP
    dict_keys(['solver', 'checker'])
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from itertools import pairwise
from typing import Any, cast

import torch
from torch import nn

from agentrl.errors import TrainerSetupError
from agentrl.trainer.algo.losses import PREFERENCE_LOSSES
from agentrl.trainer.config import LoraConfig, TrainerConfig
from agentrl.trainer.engine.actor import ForwardOut
from agentrl.trainer.engine.batch import Batch
from agentrl.types import Trajectory

__all__ = ["RoleAdapters", "role_adapters", "role_index_BR", "roles_of"]


def role_index_BR(trajectories: Sequence[Trajectory], roles: Sequence[str], R: int) -> torch.Tensor:
    """The role (index into ``roles``) of each model token, compact (B, R); -1 on padding.

    Row b holds episode b's model tokens (``loss_mask == 1``) in order, as in
    :class:`~agentrl.trainer.engine.batch.Batch`; a token's role is that of the model
    span (``TurnSpan.role``) holding it.

    Raises:
        ValueError: A model token outside any model span with one of ``roles`` (named).
    """
    index = {r: k for k, r in enumerate(roles)}
    out = torch.full((len(trajectories), max(R, 1)), -1, dtype=torch.long)
    for b, t in enumerate(trajectories):
        of_token = [-1] * len(t.token_ids)
        for s in t.spans:
            if s.kind == "model" and s.role in index:
                of_token[s.start : s.end] = [index[s.role]] * (s.end - s.start)
        j = 0
        for i, m in enumerate(t.loss_mask):
            if not m:
                continue
            if of_token[i] < 0:
                have = sorted({s.role for s in t.spans if s.kind == "model"})
                raise ValueError(
                    f"trajectory {t.episode_id} (task {t.task_id}): model token {i} has no "
                    f"role of {list(roles)} (its turns' roles: {have}); trainer.lora.per_role "
                    "needs an env that declares Env.roles and records each turn's role"
                )
            out[b, j] = of_token[i]
            j += 1
    return out


def roles_of(batch: Batch, rows: Sequence[int], R: int) -> torch.Tensor:
    """``batch.roles_BR`` of ``rows`` (their first ``R`` model tokens).

    Raises:
        ValueError: The batch has no roles (built without ``per_role``'s masks).
    """
    if batch.roles_BR is None:
        raise ValueError(
            "trainer.lora.per_role: this batch carries no roles (Batch.roles_BR); only the "
            "policy-gradient step builds them, so set trainer.lora.per_role=false for "
            "other objectives"
        )
    return batch.roles_BR[list(rows), :R]


def role_adapters(
    config: TrainerConfig, peft_model: Any, gradient_checkpointing: bool
) -> RoleAdapters | None:
    """The adapters of ``trainer.lora.per_role`` on ``peft_model``; None without it."""
    lora = config.lora
    if peft_model is None or lora is None or not lora.per_role:
        return None
    if config.loss.name in PREFERENCE_LOSSES:
        raise TrainerSetupError(
            f"trainer.lora.per_role trains policy-gradient losses, not "
            f"trainer.loss.name={config.loss.name}: set trainer.lora.per_role=false"
        )
    if lora.serve != "adapter":
        raise TrainerSetupError(
            "trainer.lora.per_role: one merged model cannot hold a policy per role, so the "
            "servers must serve the adapters: set trainer.lora.serve=adapter"
        )
    return RoleAdapters(peft_model, lora, gradient_checkpointing=gradient_checkpointing)


def _tuner_layers(lm: nn.Module) -> list[nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in lm.modules() if isinstance(m, BaseTunerLayer)]


class RoleAdapters:
    """The adapters of ``per_role`` on one peft model, and the per-role policy forward.

    Args:
        peft_model: The ``peft.PeftModel`` made by ``apply_lora`` (adapter "default").
        cfg: ``trainer.lora`` (``per_role`` on, ``roles`` two or more distinct names).
        gradient_checkpointing: The LM recomputes activations in the backward pass: each
            recomputation then runs with the adapter of the pass that saved it.

    Raises:
        TrainerSetupError: Fewer than two roles, or duplicates (the setting named).
    """

    def __init__(self, peft_model: Any, cfg: LoraConfig, *, gradient_checkpointing: bool) -> None:
        roles = list(cfg.roles)
        ok = all(r and "." not in r and r != "default" for r in roles)
        if len(roles) < 2 or len(set(roles)) != len(roles) or not ok:
            raise TrainerSetupError(
                "trainer.lora.per_role needs two or more distinct roles (names without '.', "
                f"not 'default') in trainer.lora.roles (filled from the env's Env.roles), got "
                f"{roles}: declare roles on the env, or set trainer.lora.per_role=false"
            )
        self.roles = roles
        self.peft_model = peft_model
        pcfg = peft_model.peft_config["default"]
        for role in roles:
            peft_model.add_adapter(role, pcfg)
        with warnings.catch_warnings():  # "default was active, now deleted": as meant
            warnings.simplefilter("ignore", UserWarning)
            peft_model.delete_adapter("default")
        lm = cast(nn.Module, peft_model.base_model.model)
        self._layers: list[Any] = _tuner_layers(lm)
        self.params: dict[str, list[nn.Parameter]] = {r: [] for r in roles}
        for n, p in lm.named_parameters():
            parts = n.split(".")  # ...q_proj.lora_A.<role>.weight
            for a, b in pairwise(parts):
                if a.startswith("lora_") and b in self.params:
                    self.params[b].append(p)
        self._activate(roles[0])
        if gradient_checkpointing:
            cast(Any, lm).gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False, "context_fn": self._ctx}
            )

    # ------------------------------------------------------------------ adapters

    def _activate(self, role: str) -> None:
        """Makes ``role``'s adapter the one the LM runs; every adapter stays trainable.

        peft's own ``set_adapter`` (and leaving ``disable_adapter``) freezes the inactive
        adapters, which would keep them out of the optimizer and the checkpoints.
        """
        for m in self._layers:
            m._active_adapter = [role]  # what BaseTunerLayer.active_adapters reads
        for ps in self.params.values():
            for p in ps:
                p.requires_grad_(True)
        self.active = role

    @contextmanager
    def using(self, role: str) -> Iterator[None]:
        """Runs the block with ``role``'s adapter active (the previous one after)."""
        before = self.active
        self._activate(role)
        try:
            yield
        finally:
            self._activate(before)

    def _ctx(self) -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
        """Gradient checkpointing's contexts: recompute with the adapter active now."""
        return nullcontext(), self.using(self.active)

    def states(self) -> dict[str, dict[str, torch.Tensor]]:
        """{role: that adapter's weights on CPU, with peft's names} (as one adapter saves)."""
        from peft import get_peft_model_state_dict

        return {
            r: {
                k: v.detach().cpu().clone()
                for k, v in get_peft_model_state_dict(self.peft_model, adapter_name=r).items()
            }
            for r in self.roles
        }

    # ------------------------------------------------------------------ training

    def index_BR(self, trajectories: Sequence[Trajectory], R: int) -> torch.Tensor:
        """:func:`role_index_BR` over these adapters' roles (``Batch.roles_BR``)."""
        return role_index_BR(trajectories, self.roles, R)

    def forward(self, run: Callable[[], ForwardOut], roles_bR: torch.Tensor) -> ForwardOut:
        """The policy forward of one micro-batch: ``run()`` once per role present in
        ``roles_bR`` (compact, -1 on padding) under its adapter, each token's outputs
        taken from its own role's pass."""
        present = sorted({int(k) for k in roles_bR[roles_bR >= 0].tolist()}) or [0]
        out: ForwardOut | None = None
        for k in present:
            with self.using(self.roles[k]):
                fo = run()
            sel = (roles_bR[:, : fo.logp_bR.shape[1]] == k).to(fo.logp_bR)
            if len(present) == 1:
                return fo
            part = ForwardOut(
                fo.logp_bR * sel,
                fo.entropy_bR * sel,
                fo.values_bR * sel if fo.values_bR is not None else None,
            )
            if out is None:
                out = part
            else:
                vals = out.values_bR
                if vals is not None and part.values_bR is not None:
                    vals = vals + part.values_bR
                out = ForwardOut(out.logp_bR + part.logp_bR, out.entropy_bR + part.entropy_bR, vals)
        assert out is not None
        return out
