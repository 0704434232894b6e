"""agentrl.testing."""
