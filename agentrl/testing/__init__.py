"""Helpers for testing agentrl envs and components."""

from agentrl.testing.env_checker import EnvCheckError, check_env

__all__ = ["EnvCheckError", "check_env"]
