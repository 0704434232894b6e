"""examples/byo_agent/smolagents_agent.py, run by AgentRunner on a scripted model: a sync
solve in a thread, its python tool, smolagents' final_answer, the reward from the answer."""

from __future__ import annotations

from agentrl.gateway import AgentRunner, load_agent
from agentrl.gateway.agent_runner import client_kind
from agentrl.types import StopReason
from tests.helpers.gateway import started
from tests.helpers.paths import REPO

AGENT = f"{REPO / 'examples' / 'byo_agent' / 'smolagents_agent.py'}:solve"
PYTHON = '<tool_call>{"name": "python", "arguments": {"code": "print(2+2)"}}</tool_call>'
FINAL = '<tool_call>{"name": "final_answer", "arguments": {"answer": "\\\\boxed{4}"}}</tool_call>'


def reply(prompt: str) -> str:
    """Runs python, then answers with what it printed (smolagents' "Observation:" turn)."""
    last_user = prompt.rsplit("<|im_start|>user", 1)[-1]
    return FINAL if "Observation:\n4" in last_user else PYTHON


async def test_smolagents_example_solves_with_its_python_tool(tokenizer):
    solve, score = load_agent(AGENT)
    assert client_kind(solve) == ("openai", False) and score is None  # sync: a thread
    task = {"id": "t", "prompt": "What is 2+2?", "answer": "4"}
    async with started(tokenizer, reply, max_total_tokens=4096, max_model_len=8192) as (gw, rec):
        traj = await AgentRunner(gw, solve).run_episode(task)
    assert traj.stop_reason == StopReason.DONE and traj.reward == 1.0, traj.error
    assert traj.num_turns == 2 and traj.metrics["gateway/api_chat"] == 2
    first = tokenizer.decode(rec.prompts[0])
    assert "Solve the math problem" in first and '"final_answer"' in first
    # smolagents sends its tool calls back as text: the second request is a new segment.
    assert traj.metrics["gateway/segments"] == 2 and traj.sample_starts is not None
    assert "Observation:\n4" in tokenizer.decode(rec.prompts[1])
