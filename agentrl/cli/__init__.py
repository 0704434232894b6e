"""The ``agentrl`` command: its commands, their error messages, ``agentrl model``."""

from agentrl.cli.app import app

__all__ = ["app"]
