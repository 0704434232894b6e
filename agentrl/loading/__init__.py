"""Finding what the user names: envs by name, path or entry point; user modules; task files."""
