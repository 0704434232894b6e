"""``python -m agentrl …``: the ``agentrl`` command, for when only an interpreter is at hand
(``sys.executable -m agentrl train …`` in a subprocess)."""

from agentrl.cli import app

if __name__ == "__main__":
    app()
