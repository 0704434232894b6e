"""AgentLoop: exact trajectories, budgets, and failures that end one episode with a reason."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl import Action, Env, Message, SamplingParams, StepResult, StopReason
from agentrl.inference.protocol import Generation, LLMError
from agentrl.rollout import AgentLoop, ChatTokenizer, LoopConfig, TemplateError
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy, fake_logprob
from tests.helpers.agent_loop import AddEnv, tool_then_answer
from tests.helpers.templates import think_stripping


async def test_tool_episode_records_exact_tokens_mask_and_logprobs(tokenizer):
    llm = ScriptedLLM(TextPolicy(tokenizer, tool_then_answer))
    loop = AgentLoop(llm, tokenizer)
    traj = await loop.run(AddEnv(), {"a": 17, "b": 25}, episode_id="e0")

    assert traj.stop_reason == StopReason.DONE, traj.error
    assert traj.reward == 1.0 and traj.num_turns == 2
    traj.validate()
    # The ids equal the template's rendering of the whole conversation, tools included.
    chat = ChatTokenizer(tokenizer, tools=[AddEnv().add.schema()])
    full = chat.encode(chat.render(traj.messages))
    assert traj.token_ids == full[: len(traj.token_ids)]
    assert [m.role for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert traj.messages[3].content == "42"
    # loss_mask is 1 exactly on the two sampled turns, and each model span ends with eos.
    model_spans = [s for s in traj.spans if s.kind == "model"]
    assert len(model_spans) == 2
    masked = [i for i, m in enumerate(traj.loss_mask) if m]
    assert masked == [i for s in model_spans for i in range(s.start, s.end)]
    assert all(traj.token_ids[s.end - 1] == tokenizer.eos_token_id for s in model_spans)
    # The second request's prompt is the whole history: prompt, turn 1, tool delta.
    assert llm.requests[1] == traj.token_ids[: model_spans[1].start]
    # Logprobs are the server's, aligned to the sampled tokens; 0 elsewhere.
    for i in masked:
        assert traj.rollout_logprobs[i] == fake_logprob(traj.token_ids[i], i)
    assert all(traj.rollout_logprobs[i] == 0.0 for i in range(len(traj)) if i not in masked)
    assert traj.turn_rewards == [(model_spans[0].end - 1, 0.0), (model_spans[1].end - 1, 1.0)]
    assert traj.metrics["tool_calls"] == 1
    # Each call's record: the turn it belongs to, its id/name, latency, no failure.
    (rec,) = traj.tool_calls
    call = traj.messages[2].tool_calls[0]
    assert (rec["turn"], rec["id"], rec["name"], rec["error"]) == (0, call.id, "add", None)
    assert 0 <= rec["latency_s"] <= traj.metrics["tool_time_s"] and rec["output_chars"] == 2


async def test_malformed_tool_call_becomes_a_tool_message_not_a_crash(tokenizer):
    replies = iter(["<tool_call>{not json</tool_call>", "ANSWER 3"])
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: next(replies)))
    traj = await AgentLoop(llm, tokenizer).run(AddEnv(), {"a": 1, "b": 2})
    assert traj.stop_reason == StopReason.DONE and traj.reward == 1.0
    tool_msgs = [m for m in traj.messages if m.role == "tool"]
    assert len(tool_msgs) == 1 and "JSON" in tool_msgs[0].content
    assert traj.metrics["tool_parse_errors"] == 1
    # The model saw the error in its next prompt.
    assert "JSON" in tokenizer.decode(llm.requests[1])


class Raising(Env):
    def __init__(self, where: str) -> None:
        self.where = where
        self.closed = False

    def reset(self, task, *, seed=None):
        if self.where == "reset":
            raise RuntimeError("reset exploded")
        return "hi"

    def step(self, action):
        raise ValueError("step exploded")

    def close(self):
        self.closed = True


@pytest.mark.parametrize("where", ["reset", "step"])
async def test_env_error_ends_episode_with_traceback(tokenizer, where):
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "ok"))
    env = Raising(where)
    traj = await AgentLoop(llm, tokenizer).run(env, {})
    assert traj.stop_reason == StopReason.ENV_ERROR
    assert f"{where} exploded" in traj.error and "Traceback" in traj.error
    assert env.closed


class TupleStep(Env):
    def reset(self, task, *, seed=None):
        return "hi"

    def step(self, action):
        return ([], 1.0, True, False, {})


async def test_step_returning_a_tuple_is_an_env_error_naming_stepresult(tokenizer):
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "ok"))
    traj = await AgentLoop(llm, tokenizer).run(TupleStep(), {})
    assert traj.stop_reason == StopReason.ENV_ERROR
    assert "StepResult" in traj.error and "tuple" in traj.error


class Forever(Env):
    max_turns = 100

    def reset(self, task, *, seed=None):
        return [Message.user("talk")]

    def step(self, action):
        return StepResult(observation=[Message.user("more")], reward=0.5)


async def test_turn_budget(tokenizer):
    flags: list[bool] = []

    class Recording(Forever):
        def step(self, action):
            flags.append(action.last_turn)
            return super().step(action)

    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "words"))
    traj = await AgentLoop(llm, tokenizer, LoopConfig(max_turns=3)).run(Recording(), {})
    assert traj.stop_reason == StopReason.MAX_TURNS
    assert traj.num_turns == 3 and traj.reward == 1.5
    # The env is told which turn is its last, so it can score before the budget ends.
    assert flags == [False, False, True]


async def test_generation_budget_shrinks_as_context_grows(tokenizer):
    budgets: list[int] = []

    class Recording(ScriptedLLM):
        async def generate(self, prompt_ids, params, *, session_id=None):
            budgets.append(params.max_tokens)
            return await super().generate(prompt_ids, params, session_id=session_id)

    llm = Recording(TextPolicy(tokenizer, lambda _: "a b c d e f g h i j"))
    cfg = LoopConfig(max_turns=50, max_total_tokens=120, max_tokens_per_turn=64)
    traj = await AgentLoop(llm, tokenizer, cfg).run(Forever(), {})
    assert traj.stop_reason == StopReason.MAX_TOKENS
    assert len(traj) <= 120
    assert budgets[0] == 64
    assert budgets[-1] < budgets[-2] < 64
    assert all(b == min(64, 120 - len(p)) for b, p in zip(budgets, llm.requests, strict=True))


async def test_cut_turn_is_scored_as_the_last_then_ends_with_max_tokens(tokenizer):
    seen: list[Action] = []

    class Recording(Forever):
        def step(self, action):
            seen.append(action)
            return super().step(action)

    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: call + " word" * 100))
    cfg = LoopConfig(max_tokens_per_turn=8)
    traj = await AgentLoop(llm, tokenizer, cfg).run(Recording(), {})
    assert traj.stop_reason == StopReason.MAX_TOKENS
    assert traj.num_model_tokens == 8 and traj.num_turns == 1
    # The env saw the cut turn as its last (so it could score it), with no tool run.
    assert len(seen) == 1 and seen[0].last_turn and seen[0].finish_reason == "length"
    assert seen[0].tool_calls == () and traj.reward == 0.5


class SlowStep(Env):
    def reset(self, task, *, seed=None):
        return "hi"

    async def step(self, action):
        await asyncio.sleep(30)
        return StepResult(terminated=True)


async def test_episode_timeout(tokenizer):
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "x"))
    t = time.monotonic()
    traj = await AgentLoop(llm, tokenizer, LoopConfig(episode_timeout_s=0.3)).run(SlowStep(), {})
    assert traj.stop_reason == StopReason.TIMEOUT
    assert time.monotonic() - t < 5


class BlockingSync(Env):
    def reset(self, task, *, seed=None):
        return "hi"

    def step(self, action):
        time.sleep(0.3)  # a sync env that blocks
        return StepResult(terminated=True)


async def test_sync_env_does_not_block_the_event_loop(tokenizer):
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "x"))
    ticks = 0

    async def heartbeat():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    hb = asyncio.create_task(heartbeat())
    traj = await AgentLoop(llm, tokenizer).run(BlockingSync(), {})
    hb.cancel()
    assert traj.stop_reason == StopReason.DONE
    # Had step run on the loop thread, the heartbeat could not have ticked during it.
    assert ticks >= 10


async def test_server_failure_is_llm_error(tokenizer):
    class Down:
        async def generate(self, prompt_ids, params, *, session_id=None) -> Generation:
            raise LLMError("all servers down")

    traj = await AgentLoop(Down(), tokenizer).run(Forever(), {})
    assert traj.stop_reason == StopReason.LLM_ERROR and "all servers down" in traj.error


async def test_logprob_count_mismatch_is_refused(tokenizer):
    class Broken:
        async def generate(self, prompt_ids, params, *, session_id=None) -> Generation:
            return Generation([1, 2, tokenizer.eos_token_id], [-0.1], "stop")

    traj = await AgentLoop(Broken(), tokenizer).run(Forever(), {})
    assert traj.stop_reason == StopReason.LLM_ERROR and "logprobs" in traj.error


def test_loop_trains_a_history_rewriting_template_per_turn_and_refuses_only_when_nothing_holds(
    tokenizer,
):
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "x"))
    loop = AgentLoop(llm, think_stripping(tokenizer))
    assert loop.strategy == "per_turn" and loop.template_report.verdict == "not consistent"
    assert AgentLoop(llm, tokenizer).strategy == "as_sampled"
    # Either strategy can be forced where it holds, and the check can be turned off.
    forced = AgentLoop(llm, think_stripping(tokenizer), LoopConfig(template_strategy="as_sampled"))
    assert forced.strategy == "as_sampled"
    AgentLoop(llm, think_stripping(tokenizer), LoopConfig(check_template=False))
    # A template that raises on tool results: neither strategy holds, so the loop refuses.
    bad = think_stripping(tokenizer)
    bad.chat_template = (
        "{%- for m in messages %}{%- if m.role == 'tool' %}{{ raise_exception('no tools here') }}"
        "{%- endif %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    with pytest.raises(TemplateError, match="neither as_sampled nor per_turn holds") as e:
        AgentLoop(llm, bad)
    assert "no tools here" in str(e.value)


async def test_sampling_params_are_passed_through_with_the_turn_budget(tokenizer):
    seen: list[SamplingParams] = []

    class Recording(ScriptedLLM):
        async def generate(self, prompt_ids, params, *, session_id=None):
            seen.append(params)
            return await super().generate(prompt_ids, params, session_id=session_id)

    cfg = LoopConfig(
        sampling=SamplingParams(temperature=0.7, top_p=0.9, seed=3), max_tokens_per_turn=33
    )
    await AgentLoop(Recording(TextPolicy(tokenizer, lambda _: "x")), tokenizer, cfg).run(
        Forever(), {}, episode_id="ep-1"
    )
    assert seen and all(
        (p.temperature, p.top_p, p.seed, p.max_tokens) == (0.7, 0.9, 3, 33) for p in seen
    )
