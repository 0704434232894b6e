"""``python -m agentrl.cli``: the CLI, user errors as one line."""

from agentrl.cli.app import main

main()
