"""Built-in tools (installed as agentrl.builtin_tools)."""
