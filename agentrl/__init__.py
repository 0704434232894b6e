"""agentrl: reinforcement learning for multi-turn, tool-using LLM agents.

The public API: the env contract, the types an episode is made of, the LLM client contract.
"""

from agentrl import compat
from agentrl.env import Env
from agentrl.inference.protocol import Generation, LLMClient, SamplingParams
from agentrl.types import Action, Message, StepResult, StopReason, ToolCall, Trajectory, TurnSpan

__version__ = "0.1.0"

compat.install()  # old module paths keep importing (agentrl.compat.MOVED)

__all__ = [
    "Action",
    "Env",
    "Generation",
    "LLMClient",
    "Message",
    "SamplingParams",
    "StepResult",
    "StopReason",
    "ToolCall",
    "Trajectory",
    "TurnSpan",
    "__version__",
]
