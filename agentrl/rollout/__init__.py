"""agentrl.rollout."""
