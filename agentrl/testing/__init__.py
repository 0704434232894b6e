"""Helpers for testing agentrl envs and components."""

from agentrl.testing.env_checker import EnvCheckError, check_env
from agentrl.testing.task_check import check_env_on_tasks

__all__ = ["EnvCheckError", "check_env", "check_env_on_tasks"]
