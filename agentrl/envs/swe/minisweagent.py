"""mini-swe-agent on the SWE env's tasks, with no glue: one agent spec.

    agentrl train --env swe --agent agentrl.envs.swe.minisweagent:solve \\
        rollout.max_total_tokens=8192

Each episode sets up the task as :class:`~envs.swe.env.SweEnv` does (a container, the
snapshot in ``/workspace/repo`` as a one-commit git repository, no hidden tests) and runs
mini-swe-agent's own ``DefaultAgent`` with its default config (``mini.yaml``, the ``mini``
command's: prompts, tool-calling ``bash``, observation and format-error templates) in a
worker thread. Its model is mini-swe-agent's ``LitellmModel`` pointed at the episode's
gateway URL, with cost tracking off (``cost_tracking: ignore_errors``) and no retries
(the gateway is local: a failed request ends the episode); its environment is an
:class:`~adapters.minisweagent.AgentrlSandboxEnvironment` over the container, starting in
the repository. When the agent submits (``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``)
or stops (repeated format errors, its limits, the run's token or turn budget), the
repository's diff is graded in a fresh container by the SWE grader: that is the reward.

The Trajectory gets the SWE env's metrics and info (``swe_resolved``,
``swe_patch_applied``, ``swe_ended_by``, ...) and mini-swe-agent's: ``minisweagent_commands``
(count; the commands in ``info["minisweagent_command_log"]``), ``minisweagent_model_calls``,
``minisweagent_submitted``, and ``info["minisweagent_exit_status"]``.

Another config, image or limits: ``solve = MiniSweAgent(config="my_config.yaml")`` in your
own file, then ``--agent my_file.py:solve``.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import openai

from agentrl.adapters.minisweagent import (
    AgentrlSandboxEnvironment,
    minisweagent_module,
    require_minisweagent,
)
from agentrl.reporting.episode import report_episode
from agentrl.runtime.threads import in_daemon_thread
from agentrl.sandbox.base import SandboxLimits

from .env import AGENT_LIMITS, SweEnv
from .grader import Grader
from .task import SweTask
from .workspace import REPO_DIR

__all__ = ["DEFAULT_CONFIG", "MODEL_NAME", "MiniSweAgent", "solve"]

DEFAULT_CONFIG = "mini.yaml"
#: litellm's OpenAI-compatible provider; the gateway ignores the model's name.
MODEL_NAME = "openai/policy"
_MAX_RECORDED = 200  # commands kept in info


class MiniSweAgent:
    """``solve(task, client)`` running mini-swe-agent's DefaultAgent on a SWE task.

    Args:
        config: mini-swe-agent config: a name of its built-in configs (``mini.yaml``,
            ``default.yaml``, ``swebench.yaml``), a YAML path, or a dict with ``agent``,
            ``model`` and ``environment`` sections. The model's name and endpoint are the
            gateway's; ``environment.cwd`` is always the repository.
        tasks: Tasks a row ``{"id": ...}`` may name (default: the built-in set).
        image: Image for tasks that name none (None: agentrl/python).
        limits: Limits of the agent's container.
        grader: The grader (default: a :class:`Grader` with fresh containers).
        max_command_timeout_s: Cap of one command's timeout (the config's
            ``environment.timeout`` is the default, 30 s if unset).

    Raises:
        MiniSweAgentMissingError: mini-swe-agent is not installed.
    """

    def __init__(
        self,
        config: str | Path | Mapping[str, Any] = DEFAULT_CONFIG,
        *,
        tasks: Sequence[SweTask] | None = None,
        image: str | None = None,
        limits: SandboxLimits = AGENT_LIMITS,
        grader: Grader | None = None,
        max_command_timeout_s: float = 120.0,
    ) -> None:
        require_minisweagent()
        self.config_spec = config
        self.tasks = tasks
        self.image = image
        self.limits = limits
        self.grader = grader
        self.max_command_timeout_s = max_command_timeout_s
        self._config: dict[str, Any] | None = None

    def config(self) -> dict[str, Any]:
        """The mini-swe-agent config (loaded once; imports mini-swe-agent)."""
        if self._config is None:
            if isinstance(self.config_spec, Mapping):
                self._config = copy.deepcopy(dict(self.config_spec))
            else:
                minisweagent_module()
                from minisweagent.config import get_config_from_spec

                self._config = dict(get_config_from_spec(str(self.config_spec)))
        return copy.deepcopy(self._config)

    def build(
        self, config: Mapping[str, Any], environment: Any, base_url: str, timeout_s: float
    ) -> Any:
        """mini-swe-agent's agent (``config``'s ``agent`` section) for one episode: its model
        (the ``model`` section) on the gateway at ``base_url``, acting in ``environment``."""
        minisweagent_module()
        from minisweagent.agents import get_agent
        from minisweagent.models import get_model

        model_config = dict(config.get("model") or {})
        model_config["model_name"] = MODEL_NAME
        model_config["cost_tracking"] = "ignore_errors"
        model_config["model_kwargs"] = {
            **(model_config.get("model_kwargs") or {}),
            "api_base": base_url,
            "api_key": "agentrl",
            "timeout": timeout_s,
        }
        model: Any = get_model(config=model_config)
        # The gateway is local: an error is the episode's end (or its budget), never transient.
        model.abort_exceptions = [BaseException]
        agent_config = dict(config.get("agent") or {})
        agent_config.pop("output_path", None)  # no trajectory files: the run records them
        return get_agent(model, environment, agent_config, default_type="default")

    def environment(self, config: Mapping[str, Any], sandbox: Any) -> AgentrlSandboxEnvironment:
        """The agent's environment over ``sandbox`` (``config``'s ``environment`` section;
        commands start in the repository). Call it on the sandbox's event loop."""
        settings = dict(config.get("environment") or {})
        settings["cwd"] = REPO_DIR
        settings["max_timeout"] = self.max_command_timeout_s
        settings["timeout"] = min(
            float(settings.get("timeout") or 30.0), self.max_command_timeout_s
        )
        return AgentrlSandboxEnvironment(sandbox, loop=asyncio.get_running_loop(), **settings)

    async def __call__(self, task: dict[str, Any], client: openai.AsyncOpenAI) -> float:
        """One episode: the agent's work on ``task``, graded; returns the reward."""
        env = SweEnv(tasks=self.tasks, image=self.image, limits=self.limits, grader=self.grader)
        environment: AgentrlSandboxEnvironment | None = None
        agent: Any = None
        try:
            messages = await env.reset(task)
            # The first call imports mini-swe-agent.
            config = await in_daemon_thread(self.config, name="agentrl-minisweagent")
            environment = ready = self.environment(config, env.sandbox)
            base_url, timeout_s = str(client.base_url), _timeout(client)

            def run() -> dict[str, Any]:
                nonlocal agent
                agent = self.build(config, ready, base_url, timeout_s)  # imports litellm
                return dict(agent.run(messages[-1].content) or {})

            try:
                exit_info = await in_daemon_thread(run, name="agentrl-minisweagent")
            finally:
                environment.close()
            status = str(exit_info.get("exit_status") or "")
            result = await env.finish("submit" if status == "Submitted" else status)
            report_episode(result.metrics, result.info)
            report_episode(
                {"minisweagent_submitted": float(status == "Submitted")},
                {
                    "minisweagent_exit_status": status,
                    "minisweagent_submission": str(exit_info.get("submission") or "")[:4000],
                },
            )
            return result.reward
        finally:
            _report_agent(environment, agent)
            await env.close()


def _timeout(client: Any) -> float:
    t = getattr(client, "timeout", None)
    t = getattr(t, "read", t)  # an httpx.Timeout
    return float(t) if isinstance(t, int | float) and t > 0 else 300.0


def _report_agent(environment: AgentrlSandboxEnvironment | None, agent: Any) -> None:
    """The commands the agent ran and its model calls, whatever ended the episode."""
    commands = environment.commands if environment is not None else []
    report_episode(
        {
            "minisweagent_commands": float(len(commands)),
            "minisweagent_command_timeouts": float(sum(c.timed_out for c in commands)),
            "minisweagent_model_calls": float(getattr(agent, "n_calls", 0)),
        },
        {
            "minisweagent_command_log": [
                {"command": c.command[:1000], "returncode": c.returncode}
                for c in commands[:_MAX_RECORDED]
            ]
        },
    )


solve = MiniSweAgent()
