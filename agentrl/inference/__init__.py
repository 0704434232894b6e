"""agentrl.inference."""
