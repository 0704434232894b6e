"""Pure math of the learner: advantages, policy losses, rollout correction, KL, reward shaping."""
