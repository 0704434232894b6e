"""SkyrlEnv: a `skyrl-gym <https://github.com/NovaSky-AI/SkyRL>`_ text env as an Env.

``agentrl train --env skyrl:NAME tasks=rows.parquet`` trains on skyrl's own task rows,
unchanged: ``prompt`` (chat messages), ``env_class``, ``reward_spec``, ``extra_info`` and any
other columns. As SkyRL's generator does, every episode makes its env with
``skyrl_gym.make(env_class, env_config=..., extras=ROW)`` where ``extras`` is the row
without ``prompt`` and ``env_class``; the row's ``env_class`` picks the env (NAME is the
default for rows without one). ``init(prompt)`` gives the first messages; each model turn
is passed to ``step`` as its text, and skyrl's ``observations``, ``reward``, ``done`` and
``metadata`` become the StepResult's observation, reward, ``terminated`` and ``info``.
An exception inside the skyrl env ends that episode as ``env_error``, with the reason.

Example:
    >>> Gsm8k = skyrl_env_class("gsm8k")
    >>> env = Gsm8k()
    >>> row = {"prompt": [{"role": "user", "content": "1+1?"}], "env_class": "gsm8k",
    ...        "reward_spec": {"method": "rule", "ground_truth": "2"}}
    >>> [m.content for m in env.reset(row)]
    ['1+1?']
    >>> from agentrl import Action
    >>> r = env.step(Action(text="#### 2"))
    >>> r.reward, r.terminated
    (1.0, True)
"""

from __future__ import annotations

import copy
import importlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from agentrl.env import Env
from agentrl.types import Action, Message, StepResult

__all__ = ["INSTALL_HINT", "SkyrlEnv", "skyrl_env_class"]

INSTALL_HINT = "pip install 'agentrl[skyrl]'"
_ROW_ONLY = ("prompt", "env_class")  # the fields SkyRL's dataset does not pass as extras


def _skyrl_gym() -> Any:
    try:
        import skyrl_gym
    except ImportError as e:
        raise ImportError(f"skyrl-gym envs need the skyrl-gym package: {INSTALL_HINT}") from e
    return skyrl_gym


class SkyrlEnv(Env):
    """One skyrl-gym env per episode, made from the episode's task row.

    Args:
        env_config: The env's config, as SkyRL's ``environment.skyrl_gym.<NAME>`` section
            (e.g. ``{"db_path": ...}`` for ``text2sql``); handed to the env as an
            ``omegaconf.DictConfig``.
        max_turns: Passed to the env as ``extras["max_turns"]``, as SkyRL's
            ``generator.max_turns`` is; None: the row's ``max_turns`` or the env's default.
            The loop's own limit is ``rollout.max_turns``.
    """

    name = "skyrl"
    max_turns = 100  # the skyrl env's own `done` ends an episode, under rollout.max_turns
    skyrl_name: ClassVar[str] = ""
    """The skyrl-gym env for rows without ``env_class``."""

    def __init__(
        self, *, env_config: Mapping[str, Any] | None = None, max_turns: int | None = None
    ) -> None:
        self.env_config = dict(env_config or {})
        self._max_turns = max_turns
        self.skyrl_env: Any = None
        self.env_class = self.skyrl_name

    def reset(self, task: Mapping[str, Any], *, seed: int | None = None) -> list[Message]:
        """Makes the row's env and returns what its ``init(prompt)`` gives (``seed`` unused)."""
        from omegaconf import OmegaConf

        self.close()
        self.env_class = str(task.get("env_class") or self.skyrl_name)
        prompt = task.get("prompt")
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if not isinstance(prompt, Sequence) or not prompt:
            raise ValueError(
                f"skyrl task row: 'prompt' must be a non-empty list of chat messages, got "
                f"{type(prompt).__name__}; the row's fields: {', '.join(map(str, task))}"
            )
        extras = {k: copy.deepcopy(v) for k, v in task.items() if k not in _ROW_ONLY}
        if self._max_turns is not None:
            extras["max_turns"] = self._max_turns
        config = OmegaConf.create(self.env_config)
        self.skyrl_env = self._call(
            "make", _skyrl_gym().make, self.env_class, env_config=config, extras=extras
        )
        obs, _info = self._call("init", self.skyrl_env.init, [dict(m) for m in prompt])
        return _messages(obs, f"{self.env_class}.init")

    def step(self, action: Action) -> StepResult:
        """Steps the env with the model's text; its metrics come with the episode's last step."""
        if self.skyrl_env is None:
            raise RuntimeError("SkyrlEnv.step before reset")
        out = self._call("step", self.skyrl_env.step, action.text)
        done = bool(out["done"])
        metadata = out.get("metadata") or {}
        metrics: dict[str, float] = {}
        get_metrics = getattr(self.skyrl_env, "get_metrics", None)  # BaseTextEnv's
        if (done or action.last_turn) and get_metrics is not None:
            env_metrics = self._call("get_metrics", get_metrics) or {}
            numbers = {k: v for k, v in env_metrics.items() if isinstance(v, (int, float))}
            metrics = {f"skyrl/{k}": float(v) for k, v in numbers.items()}
        return StepResult(
            observation=_messages(out.get("observations"), f"{self.env_class}.step"),
            reward=float(out["reward"] or 0.0),
            terminated=done,
            metrics=metrics,
            info={"skyrl_metadata": dict(metadata)} if metadata else {},
        )

    def close(self) -> None:
        env, self.skyrl_env = self.skyrl_env, None
        if env is not None:
            env.close()

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(...)``; an exception names the skyrl env and the call (the episode's reason)."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise RuntimeError(
                f"skyrl env {self.env_class!r}: {what} raised {type(e).__name__}: {e}"
            ) from e


def _messages(obs: Any, where: str) -> list[Message]:
    """skyrl's observations (OpenAI-style message dicts) as Messages."""
    if obs is None:
        return []
    if isinstance(obs, (str, Mapping)):
        obs = [obs]
    out = []
    for m in obs:
        if m is None:
            continue
        if isinstance(m, str):
            out.append(Message.user(m))
        elif isinstance(m, Mapping) and "role" in m:
            out.append(Message.from_dict(dict(m)))
        else:
            raise TypeError(f"{where} gave {m!r:.80}, not a chat message {{'role', 'content'}}")
    return out


def skyrl_env_class(name: str) -> type[SkyrlEnv]:
    """A SkyrlEnv subclass for the skyrl-gym env ``name`` (what ``--env skyrl:NAME`` resolves to).

    ``name`` may be ``pkg.module:NAME`` for an env that ``pkg.module`` registers with
    ``skyrl_gym.register`` when imported. Its constructor takes SkyrlEnv's arguments.

    Raises:
        ImportError: skyrl-gym is not installed (the message says how to install it).
        LookupError: No skyrl-gym env is registered as ``name``; the message lists those that are.
    """
    gym = _skyrl_gym()
    module, _, env_id = name.rpartition(":")
    if module:
        importlib.import_module(module)
    if env_id not in gym.registry:
        known = ", ".join(sorted(gym.registry)) or "(none)"
        raise LookupError(
            f"no skyrl-gym env {env_id!r}; registered: {known} (an env of your own: "
            "'skyrl:pkg.module:NAME', a module that calls skyrl_gym.register on import)"
        )
    safe = re.sub(r"\W", "_", env_id)
    attrs = {"skyrl_name": env_id, "name": f"skyrl:{name}", "__module__": __name__}
    return type(f"Skyrl_{safe}", (SkyrlEnv,), attrs)
