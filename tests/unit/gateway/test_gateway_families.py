"""The gateway with published template families: several end-of-turn tokens (gpt-oss's
<|call|>, GLM's <|observation|>) and templates that drop tools (Hermes injected, which
``tool_parser="auto"`` must then read), through the real ``openai`` client."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from agentrl.gateway import Gateway, GatewayLimits
from agentrl.gateway.transport import in_process_client
from agentrl.rollout import ChatTokenizer, LoopConfig
from agentrl.testing.scripted_server import TextPolicy
from tests.data.templates.families import family_tokenizer
from tests.helpers.agent_loop import AddEnv
from tests.helpers.gateway import Recording
from tests.helpers.templates import CASES

TOOLS = [AddEnv().add.schema()]


async def _episode(name: str, limits: GatewayLimits) -> tuple[Any, Recording, list[Any]]:
    """Two requests through the gateway: the tool call, then the answer to its result."""
    tok, case = family_tokenizer(name), CASES[name]
    replies = iter([case.call, case.answer])
    rec = Recording(TextPolicy(tok, lambda _prompt: next(replies)))
    async with Gateway(rec, tok, limits) as gw:
        s = gw.open_session(name)
        client = openai.AsyncOpenAI(
            base_url=gw.base_url(s), api_key="-", max_retries=0, http_client=in_process_client(gw)
        )
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Add 2 and 3."}]
        r1 = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        m1 = r1.choices[0].message
        msgs += [
            m1.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": m1.tool_calls[0].id, "content": "5"},
        ]
        r2 = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        await client.close()
        traj = s.trajectory(task_id="t", group_id="g", reward=1.0, stop_reason="done")
    return traj, rec, [r1, r2]


@pytest.mark.parametrize("name", ["gpt_oss", "glm4_6"])
async def test_turns_end_on_any_of_the_familys_end_of_turn_tokens(name):
    tok, case = family_tokenizer(name), CASES[name]
    loop = LoopConfig(tool_parser=case.parser, reasoning_parser=case.reasoning_parser)
    traj, rec, (r1, r2) = await _episode(name, GatewayLimits(loop=loop, strategy=case.strategy))
    stop = tok.convert_tokens_to_ids("<|call|>" if name == "gpt_oss" else "<|observation|>")
    assert stop != tok.eos_token_id
    assert all(stop in p.stop_token_ids for p in rec.params)  # the server stops on it
    c1 = r1.choices[0]
    assert c1.finish_reason == "tool_calls"
    [call] = c1.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("add", '{"a": 2, "b": 3}')
    assert "ANSWER 5" in (r2.choices[0].message.content or "")
    # The sampled turns are recorded as sampled, ending on the family's own tokens.
    chat = ChatTokenizer(tok, tools=TOOLS)
    model = [sp for sp in traj.spans if sp.kind == "model"]
    sampled = [traj.token_ids[sp.start : sp.end] for sp in model]
    assert [chat.decode(ids) for ids in sampled] == [case.call, case.answer]
    assert sampled[0][-1] == stop
    assert traj.sample_starts == [0, model[0].end]  # per_turn: each request its own sample
    assert rec.prompts[1] == traj.token_ids[model[0].end : model[1].start]


async def test_auto_reads_injected_hermes_tools_on_a_template_that_drops_them():
    # SmolLM2's template drops tools: they are injected in the Hermes format, so 'auto'
    # (which finds no tool markup in this template) must read Hermes, as the AgentLoop does.
    name = "chatml_smollm2"
    limits = GatewayLimits(loop=LoopConfig(tool_parser="auto"), inject_tools=True)
    assert limits.tool_parser == "hermes"
    traj, rec, (r1, r2) = await _episode(name, limits)
    [call] = r1.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("add", '{"a": 2, "b": 3}')
    tok = family_tokenizer(name)
    assert '"name": "add"' in tok.decode(rec.prompts[0])  # the schemas were injected
    assert r2.choices[0].message.content == "ANSWER 5"
    assert traj.sample_starts == [] and traj.num_turns == 2
