"""The README's hello-world env, end to end over real HTTP against the scripted server."""

from __future__ import annotations

from agentrl import StopReason
from agentrl.inference.client import CompletionsClient
from agentrl.loading.envs import resolve_env
from agentrl.rollout import AgentLoop, RolloutRunner
from agentrl.testing.scripted_server import ScriptedServer, TextPolicy, fake_logprob


def reply(prompt: str) -> str:
    # Says the word only when asked for "hello", so rewards differ across tasks.
    return "hello there" if "'hello'" in prompt else "no idea"


async def test_hello_world_env_over_http(tokenizer):
    env_cls = resolve_env("examples/hello_env.py:SayWord")
    with ScriptedServer(TextPolicy(tokenizer, reply)) as server:
        async with CompletionsClient(server.url) as client:
            runner = RolloutRunner(AgentLoop(client, tokenizer), env_cls, group_size=2)
            result = await runner.run([{"word": "hello"}, {"word": "goodbye"}])

    rewards = [[t.reward for t in g] for g in result.groups]
    assert rewards == [[1.0, 1.0], [0.0, 0.0]]
    assert all(t.stop_reason == StopReason.DONE for t in result.trajectories)
    # Every request went over HTTP with the token-id prompt, and the tokens and
    # logprobs the server sent back are in the trajectory unchanged.
    assert len(server.requests) == 4
    sent_prompts = sorted(tuple(r["prompt"]) for r in server.requests)
    assert sent_prompts == sorted(
        tuple(t.token_ids[: t.prompt_length]) for t in result.trajectories
    )
    for t in result.trajectories:
        t.validate()
        sampled = [i for i, m in enumerate(t.loss_mask) if m]
        assert sampled == list(range(t.prompt_length, len(t)))
        assert t.token_ids[-1] == tokenizer.eos_token_id
        assert [t.rollout_logprobs[i] for i in sampled] == [
            fake_logprob(t.token_ids[i], i) for i in sampled
        ]
