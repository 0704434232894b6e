"""Other frameworks' envs and agents on agentrl: Gymnasium, skyrl-gym, verifiers, mini-swe-agent."""
