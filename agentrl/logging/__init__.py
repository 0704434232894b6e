"""agentrl.logging."""
