"""Envs from other frameworks, wrapped as agentrl envs (Gymnasium)."""
