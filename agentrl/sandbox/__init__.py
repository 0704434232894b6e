"""agentrl.sandbox."""
