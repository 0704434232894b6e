"""OpenAI-compatible gateway: bring-your-own agents, recorded token for token."""
