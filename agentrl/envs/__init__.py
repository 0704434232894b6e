"""Built-in environments (installed as agentrl.envs)."""
