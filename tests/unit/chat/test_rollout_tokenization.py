"""Delta tokenization and the template consistency check."""

from __future__ import annotations

import pytest

from agentrl.chat.consistency import check_chat_template, synthetic_conversations
from agentrl.chat.tokenization import ChatTokenizer, TemplateError
from agentrl.types import Message, ToolCall
from tests.helpers.templates import think_stripping


def test_deltas_add_up_to_the_full_rendering(tokenizer):
    chat = ChatTokenizer(tokenizer)
    call = ToolCall("python", {"code": "print(1+1)"}, id="call_0")
    conv = [
        Message.user("What is 1+1?"),
        Message.assistant("", (call,)),
        Message.tool("2", tool_call_id="call_0", name="python"),
    ]
    ids = chat.prompt_ids(conv[:1])
    # The model's turn as sampled: the template's assistant text, ending with eos.
    asst = chat.render(conv[:2])[len(chat.render(conv[:1], add_generation_prompt=True)) :]
    asst = asst[: asst.rindex("<|im_end|>") + len("<|im_end|>")]
    ids += chat.encode(asst)
    ids += chat.delta_ids(conv[2:])
    assert ids == chat.encode(chat.render(conv, add_generation_prompt=True))
    # The delta starts with what the template writes after eos ("\n") and ends with
    # the next generation prompt.
    assert chat.delta_text(conv[2:]).startswith("\n<|im_start|>user\n<tool_response>\n2")
    assert chat.delta_text(conv[2:]).endswith("<|im_start|>assistant\n")


def test_delta_cost_does_not_depend_on_history(tokenizer):
    chat = ChatTokenizer(tokenizer)
    # The delta of a message is computed against a fixed base, once: appended after any
    # history that ends with the model's turn, it gives that history's full rendering.
    msg = Message.user("again")
    delta = chat.delta_ids([msg])
    call = ToolCall("python", {"code": "print(3)"}, id="call_7")
    histories = [
        [Message.user("hi"), Message.assistant("hello")],
        [
            Message.system("You add numbers."),
            Message.user("1+2?"),
            Message.assistant("", (call,)),
            Message.tool("3", tool_call_id="call_7", name="python"),
            Message.assistant("It is 3."),
        ],
    ]
    for history in histories:
        sampled = chat.render(history)
        sampled = sampled[: sampled.rindex("<|im_end|>") + len("<|im_end|>")]  # ends with eos
        full = chat.encode(chat.render([*history, msg], add_generation_prompt=True))
        assert chat.encode(sampled) + delta == full, history
    assert chat.delta_text([]) == "\n<|im_start|>assistant\n"


def test_prompt_ids_renders_each_prompt_once_and_hands_out_copies(tokenizer, monkeypatch):
    chat = ChatTokenizer(tokenizer)
    call = ToolCall("python", {"code": "print(1)"}, id="call_0")
    prompt = [Message.system("sys"), Message.user("q"), Message.assistant("", (call,))]
    fresh = chat.encode(chat.render(prompt, add_generation_prompt=True))
    renders = []
    render = chat.render
    monkeypatch.setattr(chat, "render", lambda *a, **k: renders.append(a) or render(*a, **k))
    first = chat.prompt_ids(prompt)
    first.append(-1)  # a caller's list is its own
    assert chat.prompt_ids(list(prompt)) == fresh and len(renders) == 1
    other = [Message.system("sys"), Message.user("q2")]
    assert chat.prompt_ids(other) == chat.encode(render(other, add_generation_prompt=True))
    assert len(renders) == 2
    kept = []
    for i in range(300):  # bounded: the oldest prompts are dropped
        kept.append(len(chat.prompt_ids([Message.user(str(i))])))
    assert len(chat.prompt_cache) == 256
    assert chat.prompt_cache.nbytes() == 4 * sum(kept[-256:])  # 4 bytes a token
    chat.prompt_ids(prompt)
    assert len(renders) == 2 + 300 + 1


def test_tokenizer_without_chat_template_is_refused(tokenizer):
    bare = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|im_end|>")
    bare.chat_template = None
    with pytest.raises(TemplateError, match="no chat_template"):
        ChatTokenizer(bare)


def test_agentrl_template_is_prefix_consistent(tokenizer):
    report = check_chat_template(tokenizer)
    assert report.ok, report.summary()
    assert len(report.results) == len(synthetic_conversations())


def test_check_reports_a_template_that_rewrites_history(tokenizer):
    report = check_chat_template(think_stripping(tokenizer))
    assert not report.ok
    bad = report.results["reasoning blocks over several turns"]
    first_bad = next(t for t in bad if not t.ok)
    assert first_bad.mismatch_at > 0
    assert "inference" in first_bad.diff and "<think>" in first_bad.diff
    # Conversations without reasoning blocks are unaffected by this template's quirk.
    assert all(t.ok for t in report.results["env feedback as user turns"])
    assert "prefix-consistent: NO" in report.summary()


def test_call_ids_are_mapped_to_nine_characters_on_calls_and_results_alike():
    from agentrl.chat.template_text import nine_char_id

    assert nine_char_id("a1B2c3D4e") == "a1B2c3D4e"  # a native Mistral id is kept
    mapped = nine_char_id("call_0")
    assert len(mapped) == 9 and mapped.isalnum() and mapped == nine_char_id("call_0")
    assert nine_char_id("call_1") != mapped


async def test_a_template_error_in_a_delta_ends_the_episode_with_tokenization_error(tokenizer):
    # With the start-up check off, a template that raises on tool results ends the episode
    # with tokenization_error and the template's own message (not internal_error).
    from agentrl.rollout import AgentLoop, LoopConfig
    from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy
    from agentrl.types import StopReason
    from tests.helpers.agent_loop import AddEnv, tool_then_answer

    bad = think_stripping(tokenizer)
    bad.chat_template = (
        "{%- for m in messages %}{%- if m.role == 'tool' %}{{ raise_exception('no results') }}"
        "{%- endif %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    loop = AgentLoop(
        ScriptedLLM(TextPolicy(bad, tool_then_answer)), bad, LoopConfig(check_template=False)
    )
    traj = await loop.run(AddEnv(), {"a": 1, "b": 2})
    assert traj.stop_reason == StopReason.TOKENIZATION_ERROR
    assert "no results" in traj.error and "Traceback" not in traj.error
