"""The trajectory inspector: ``agentrl view RUN_DIR --web`` serves a local page of a run.

Episodes filterable by step, reward, stop reason and task; each episode's tokens
coloured by loss mask or rollout probability, its turns, rewards, tool calls and
sample boundaries; a tree rollout's group as a tree with each turn's advantage
(:mod:`agentrl.inspector.tree`); the dashboard's metrics per step. Plain HTML/JS/CSS shipped with
the package (``static/``), a JSON API behind it (:mod:`agentrl.inspector.app`).
"""

from agentrl.inspector.app import create_app
from agentrl.inspector.data import NotARunDirError, RunData
from agentrl.inspector.serve import ServeError, bind, serve
from agentrl.inspector.tokens import TokenDecoder, TokenizerNotFoundError, find_decoder

__all__ = [
    "NotARunDirError",
    "RunData",
    "ServeError",
    "TokenDecoder",
    "TokenizerNotFoundError",
    "bind",
    "create_app",
    "find_decoder",
    "serve",
]
