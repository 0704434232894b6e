"""OpenAI- and Anthropic-compatible gateway: bring-your-own agents, recorded token for token.

``Gateway`` serves ``/sessions/{token}/v1/chat/completions`` (and ``completions``,
``responses``, ``messages``, ``models``) in front of the Router; ``Session`` keeps
each episode's exact token history; ``AgentRunner`` runs ``solve(task, client)``
(async, or sync in a thread) per episode and turns each session into Trajectories.
See docs/gateway.md.
"""

from agentrl.gateway.agent_runner import AgentRunner, AgentSpecError, load_agent
from agentrl.gateway.server import Gateway
from agentrl.gateway.session import GatewayLimits, Session

__all__ = ["AgentRunner", "AgentSpecError", "Gateway", "GatewayLimits", "Session", "load_agent"]
