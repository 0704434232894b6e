"""trainer.lora.per_role at start-up: the adapters' roles come from the env."""

from __future__ import annotations

import pytest

from agentrl import Env
from agentrl.config import RunConfig
from agentrl.errors import UserError
from agentrl.orchestration.startup import loop_config, resolve_roles


class Duo(Env):
    roles = ("planner", "coder")


class Solo(Env):
    roles = ("solver",)


def test_per_role_takes_the_envs_roles() -> None:
    cfg = RunConfig(trainer={"lora": {"rank": 4, "per_role": True}})
    out = resolve_roles(cfg, Duo)
    assert out.trainer.lora is not None and out.trainer.lora.roles == ["planner", "coder"]
    assert cfg.trainer.lora is not None and cfg.trainer.lora.roles == []  # input unchanged
    plain = RunConfig(trainer={"lora": {"rank": 4}})
    assert resolve_roles(plain, Solo) is plain
    assert loop_config(out).role_adapters and not loop_config(plain).role_adapters


@pytest.mark.parametrize("env", [Solo, Env])
def test_per_role_with_fewer_than_two_roles_stops_before_start(env: type[Env]) -> None:
    cfg = RunConfig(trainer={"lora": {"rank": 4, "per_role": True}})
    with pytest.raises(UserError, match=rf"trainer.lora.per_role: env {env.__name__} declares"):
        resolve_roles(cfg, env)
