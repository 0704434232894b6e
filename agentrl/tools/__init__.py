"""agentrl.tools."""
