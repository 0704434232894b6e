"""agentrl.models."""
