"""SWE-style code-agent environment."""
