"""agentrl.orchestration."""
