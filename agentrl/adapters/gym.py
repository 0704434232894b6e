"""GymnasiumEnv: any ``gymnasium.Env`` with discrete actions and text observations as an Env.

The observation is shown to the model as text (the env's ``ansi`` rendering when it
has one, else ``str(obs)``, or a ``render_obs`` you pass); the model's reply is
parsed into an action (by default the last integer or action name in it).

Example:
    >>> env = GymnasiumEnv(
    ...     "FrozenLake-v1", make_kwargs={"is_slippery": False},
    ...     action_names=["left", "down", "right", "up"],
    ... )
    >>> msgs = env.reset({}, seed=0)
    >>> from agentrl import Action
    >>> env.step(Action(text="I go right")).reward
    0.0
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrl.env import Env
from agentrl.types import Action, Message, StepResult

__all__ = ["GymnasiumEnv", "ansi_to_text", "gym_env_class"]

_STYLED = re.compile(r"\x1b\[[0-9;]*m(.+?)\x1b\[0m", re.DOTALL)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_INT = re.compile(r"(?<![\w.])[+-]?\d+(?![\w.])")


def ansi_to_text(text: str) -> str:
    """Turns ANSI-highlighted text into plain text: a styled span ``X`` becomes ``[X]``."""
    return _ANSI.sub("", _STYLED.sub(r"[\1]", text)).strip()


class GymnasiumEnv(Env):
    """Wraps a ``gymnasium.Env`` (or an env id) with a ``Discrete`` action space.

    Args:
        gym_env_or_id: A gymnasium env instance, or an id for ``gymnasium.make``
            (made with ``render_mode="ansi"`` when the env supports it).
        render_obs: ``obs -> text``; default: the ``ansi`` rendering, else ``str(obs)``.
        parse_action: ``model text -> action`` (return None for "no valid action");
            default: the last integer or action name in the text.
        action_names: Names of the actions (a list indexed by action, or a
            name → action mapping), matched case-insensitively as whole words.
        instructions: Task description, sent as the system message.
        invalid_action_penalty: Reward (subtracted) for a reply with no valid action.
        max_invalid_actions: Truncate the episode after this many invalid replies
            (None: never; the loop's turn budget still applies).
        make_kwargs: Extra keyword arguments for ``gymnasium.make``.
    """

    name = "gymnasium"
    max_turns = 100

    def __init__(
        self,
        gym_env_or_id: Any,
        *,
        render_obs: Callable[[Any], str] | None = None,
        parse_action: Callable[[str], Any] | None = None,
        action_names: Sequence[str] | Mapping[str, int] | None = None,
        instructions: str = "",
        invalid_action_penalty: float = 0.0,
        max_invalid_actions: int | None = None,
        make_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        import gymnasium as gym

        self.gym_env = (
            _make(gym_env_or_id, dict(make_kwargs or {}))
            if isinstance(gym_env_or_id, str)
            else gym_env_or_id
        )
        space = self.gym_env.action_space
        if not isinstance(space, gym.spaces.Discrete):
            raise TypeError(
                f"GymnasiumEnv needs a Discrete action space, got {space!r}; "
                "wrap the env to discretize its actions first"
            )
        self._start = int(space.start)
        self._n = int(space.n)
        if isinstance(action_names, Mapping):
            self._names = {str(k).lower(): int(v) for k, v in action_names.items()}
        else:
            self._names = {
                str(k).lower(): self._start + i for i, k in enumerate(action_names or ())
            }
        self._render_obs = render_obs
        self._parse_action = parse_action
        self.instructions = instructions
        self.invalid_action_penalty = float(invalid_action_penalty)
        self.max_invalid_actions = max_invalid_actions
        self._invalid = 0

    # ------------------------------------------------------------------ episode

    def reset(self, task: Mapping[str, Any], *, seed: int | None = None) -> list[Message]:
        """Resets the gym env (``task["options"]`` goes to gymnasium's ``reset``)."""
        self._invalid = 0
        obs, _info = self.gym_env.reset(seed=seed, options=task.get("options"))
        msgs = [Message.system(self.instructions)] if self.instructions else []
        msgs.append(Message.user(f"{self.render(obs)}\n\n{self.action_help()}"))
        return msgs

    def step(self, action: Action) -> StepResult:
        """Parses the reply into an action and steps the gym env with it."""
        text = action.content or action.text
        a = self.parse(text)
        if a is None:
            self._invalid += 1
            truncated = self.max_invalid_actions is not None and (
                self._invalid >= self.max_invalid_actions
            )
            return StepResult(
                observation=[Message.user(f"Invalid action. {self.action_help()}")],
                reward=-self.invalid_action_penalty,
                truncated=truncated,
                metrics={"invalid_action": 1.0},
                info={"invalid_action": text[-200:]},
            )
        obs, reward, terminated, truncated, info = self.gym_env.step(a)
        return StepResult(
            observation=[] if (terminated or truncated) else [Message.user(self.render(obs))],
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            metrics={"invalid_action": 0.0},
            info={"action": a, "gym_info": dict(info)},
        )

    def close(self) -> None:
        self.gym_env.close()

    # ------------------------------------------------------------------ text

    def render(self, obs: Any) -> str:
        """The observation as text."""
        if self._render_obs is not None:
            return self._render_obs(obs)
        if getattr(self.gym_env, "render_mode", None) == "ansi":
            text = self.gym_env.render()
            if isinstance(text, str):
                return ansi_to_text(text)
        return str(obs)

    def parse(self, text: str) -> int | None:
        """The action in ``text``, or None when it has no valid one."""
        if self._parse_action is not None:
            a = self._parse_action(text)
            return self._valid(a)
        best: tuple[int, int] | None = None  # (position, action)
        for m in _INT.finditer(text):
            best = (m.start(), int(m.group()))
        for name, a in self._names.items():
            for m in re.finditer(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.IGNORECASE):
                if best is None or m.start() > best[0]:
                    best = (m.start(), a)
        return None if best is None else self._valid(best[1])

    def action_help(self) -> str:
        """The line telling the model how to answer."""
        if self._names:
            names = ", ".join(self._names)
            last = self._start + self._n - 1
            return f"Reply with one action: {names} (or its number {self._start}-{last})."
        return (
            f"Reply with one action: an integer from {self._start} to {self._start + self._n - 1}."
        )

    def _valid(self, a: Any) -> int | None:
        if isinstance(a, bool) or a is None:
            return None
        try:
            a = int(a)
        except (TypeError, ValueError):
            return None
        return a if self._start <= a < self._start + self._n else None


def gym_env_class(env_id: str, **make_kwargs: Any) -> type[GymnasiumEnv]:
    """A GymnasiumEnv subclass bound to ``env_id`` (what ``--env gym:ENV_ID`` resolves to).

    Its constructor takes GymnasiumEnv's keyword arguments.
    """

    def __init__(self: GymnasiumEnv, **kwargs: Any) -> None:
        kwargs["make_kwargs"] = {**make_kwargs, **(kwargs.get("make_kwargs") or {})}
        GymnasiumEnv.__init__(self, env_id, **kwargs)

    safe = re.sub(r"\W", "_", env_id)
    return type(f"Gym_{safe}", (GymnasiumEnv,), {"__init__": __init__, "name": f"gym:{env_id}"})


def _make(env_id: str, make_kwargs: dict[str, Any]) -> Any:
    """``gymnasium.make`` with ``render_mode="ansi"`` when the env lists that mode."""
    import gymnasium as gym

    if "render_mode" not in make_kwargs:
        try:
            from gymnasium.envs.registration import load_env_creator

            entry = gym.spec(env_id).entry_point
            creator = load_env_creator(entry) if isinstance(entry, str) else entry
            modes = getattr(creator, "metadata", {}).get("render_modes", [])
        except Exception:  # unusual registrations: fall back to no rendering
            modes = []
        if "ansi" in modes:
            make_kwargs["render_mode"] = "ansi"
    return gym.make(env_id, **make_kwargs)
