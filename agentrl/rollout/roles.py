"""The role of each model turn (``Env.roles``, ``Env.role``): asked, checked, recorded.

The AgentLoop asks the env before each model turn and keeps the role on the turn's span
(``TurnSpan.role``), where the trainer reads it under ``trainer.lora.per_role``; then
(``LoopConfig.role_adapters``) the request also asks for that role's adapter
(``adapter_role``).
"""

from __future__ import annotations

from typing import Any

from agentrl.env import Env

__all__ = ["adapter_kwargs", "turn_role"]


def turn_role(env: Env) -> str:
    """``env.role()`` checked against ``env.roles`` ("" for an env without roles).

    Raises:
        ValueError: The env named a role it does not declare, or returned a non-string.
    """
    roles = tuple(type(env).roles)
    if not roles:
        return ""
    role = env.role()
    if not isinstance(role, str) or role not in roles:
        raise ValueError(
            f"{type(env).__name__}.role() returned {role!r}, which is not one of its roles {roles}"
        )
    return role


def adapter_kwargs(role: str | None) -> dict[str, Any]:
    """The keyword ``LLMClient.generate`` gets for ``role``: none without a role, so a
    client written before roles existed keeps working for envs that declare none."""
    return {"adapter_role": role} if role else {}
