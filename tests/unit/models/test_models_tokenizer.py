"""The tiny model's tokenizer: deterministic, single digits, atomic specials, tool template."""

from __future__ import annotations

import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from agentrl.models.tokenizer import (
    EOS_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    build_tokenizer,
    save_tokenizer,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Runs Python code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]
CONVERSATION = [
    {"role": "system", "content": "Solve it."},
    {"role": "user", "content": "What is 48213 * 7719?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c0",
                "type": "function",
                "function": {"name": "python", "arguments": {"code": "print(48213 * 7719)"}},
            }
        ],
    },
    {"role": "tool", "content": "372156147", "tool_call_id": "c0", "name": "python"},
    {"role": "assistant", "content": "The answer is \\boxed{372156147}."},
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _render(tok, messages, **kw) -> str:
    return tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, **kw)


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_deterministic_across_processes(tok):
    code = (
        "from agentrl.models.tokenizer import build_tokenizer;"
        "print(build_tokenizer(0).backend_tokenizer.to_str())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    ).stdout.strip()
    assert out == tok.backend_tokenizer.to_str()


def test_seed_changes_vocab(tok):
    assert build_tokenizer(1).get_vocab() != tok.get_vocab()


def test_vocab_size_and_special_ids(tok):
    assert 2000 <= len(tok) <= 4096
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(
        range(len(SPECIAL_TOKENS))
    )
    assert tok.eos_token == EOS_TOKEN and tok.pad_token == PAD_TOKEN
    assert tok.bos_token is None
    assert tok.encode("hi") == tok.encode("hi", add_special_tokens=False)  # no BOS added


def test_digits_are_single_tokens(tok):
    ids = _ids(tok, "48213 * 7719 = 372156147 and 3.14159")
    pieces = [tok.decode([i]) for i in ids]
    digits = [p.strip() for p in pieces if any(c.isdigit() for c in p)]
    assert digits and all(len(d) == 1 and d.isdigit() for d in digits)
    assert "".join(digits) == "4821377193721561473" + "14159"
    vocab_digit_tokens = [t for t in tok.get_vocab() if sum(c.isdigit() for c in t) > 1]
    assert vocab_digit_tokens == []


@pytest.mark.parametrize("special", SPECIAL_TOKENS)
def test_special_tokens_atomic(tok, special):
    ids = _ids(tok, f"a{special}b")
    assert tok.convert_tokens_to_ids(special) in ids
    assert len(_ids(tok, special)) == 1


def test_roundtrip_any_text(tok):
    text = "Ünïcödé ✓ 中文 \t tabs\n\n  def f(x):\n    return x ** 2  # émoji 🎉"
    assert tok.decode(_ids(tok, text)) == text


def test_template_renders_tools_calls_and_responses(tok):
    text = _render(tok, CONVERSATION)
    assert text.startswith("<|im_start|>system\nSolve it.\n\n# Tools\n")
    assert '"name": "python"' in text and '"required": ["code"]' in text
    assert (
        '<|im_start|>assistant\n<tool_call>{"name": "python", "arguments": '
        '{"code": "print(48213 * 7719)"}}</tool_call><|im_end|>\n'
    ) in text
    assert "<|im_start|>user\n<tool_response>\n372156147\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\nThe answer is \\boxed{372156147}.<|im_end|>\n")
    assert text.count("Solve it.") == 1


def test_template_groups_consecutive_tool_messages(tok):
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "tool", "content": "a"},
        {"role": "tool", "content": "b"},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\na\n</tool_response>"
        "\n<tool_response>\nb\n</tool_response><|im_end|>\n"
    )


def test_template_without_tools_and_generation_prompt(tok):
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tokens_of_prefix_turns_are_a_prefix(tok):
    """Tokenizing a conversation turn by turn gives the tokens of the whole (delta tokenization)."""
    full = _ids(tok, _render(tok, CONVERSATION))
    for k in range(2, len(CONVERSATION) + 1):
        part = _ids(tok, _render(tok, CONVERSATION[:k]))
        assert full[: len(part)] == part


def test_saved_tokenizer_loads_with_autotokenizer(tok, tmp_path):
    loaded = AutoTokenizer.from_pretrained(save_tokenizer(tmp_path))
    assert loaded.chat_template == tok.chat_template
    assert loaded.eos_token_id == tok.eos_token_id and loaded.pad_token_id == tok.pad_token_id
    text = _render(tok, CONVERSATION)
    assert loaded.encode(text, add_special_tokens=False) == _ids(tok, text)
