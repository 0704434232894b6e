"""Chat-template tokenization with per-turn deltas.

The trajectory keeps the exact token ids the model saw and produced. Model turns
are kept as sampled; tool and env messages are tokenized as a *delta*: only the
new messages are rendered through the chat template, against a small fixed
conversation, so a turn costs the same however long the history is.

How a delta is made (the "fixed base" trick also used by verl and SkyRL):
render ``BASE`` (a user and an assistant message), render ``BASE + new`` with the
generation prompt, and keep what the second adds to the first. The assistant
turn in ``BASE`` ends with the end-of-turn token followed by whatever the
template writes after it (Qwen: a newline); the model stopped *on* the
end-of-turn token, so that trailing text is part of the delta too.

That the deltas add up to the template's rendering of the whole conversation is
a property of the template, checked by :func:`agentrl.rollout.consistency.check_chat_template`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.types import Message

__all__ = ["ChatTokenizer", "TemplateError"]

_BASE = [
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": "y"},
]


class TemplateError(ValueError):
    """The tokenizer's chat template cannot be used for exact multi-turn tokenization."""


class ChatTokenizer:
    """Renders prompts and per-turn deltas of one model's chat template to token ids.

    Args:
        tokenizer: A Hugging Face tokenizer with a ``chat_template``.
        tools: OpenAI-format tool schemas rendered into the prompt (may be empty).

    Example:
        >>> chat = ChatTokenizer(tok, tools=[python_tool.schema()])  # doctest: +SKIP
        >>> ids = chat.prompt_ids([Message.user("2+2?")])  # doctest: +SKIP
        >>> ids += sampled_ids + chat.delta_ids([Message.tool("4")])  # doctest: +SKIP
    """

    def __init__(self, tokenizer: Any, tools: Sequence[dict[str, Any]] = ()) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no "
                "chat_template; set one (tokenizer.chat_template = ...) "
                "or use a chat/instruct model"
            )
        self.tokenizer = tokenizer
        self.tools = list(tools)
        eos = tokenizer.eos_token_id
        if eos is None:
            raise TemplateError("tokenizer has no eos_token_id (the end-of-turn token)")
        self.eot_id: int = int(eos)
        self.eot_text: str = tokenizer.convert_ids_to_tokens(self.eot_id)
        base = self.render(_BASE)
        cut = base.rfind(self.eot_text)
        if cut < 0:
            raise TemplateError(
                f"the chat template does not end an assistant turn with the eos token "
                f"{self.eot_text!r}; set eos_token to the template's end-of-turn token"
            )
        self._base_text = base
        self._after_eot = base[cut + len(self.eot_text) :]

    def render(
        self, messages: Sequence[Message | dict[str, Any]], *, add_generation_prompt: bool = False
    ) -> str:
        """The chat template's text for ``messages``."""
        dicts = [m.to_dict() if isinstance(m, Message) else m for m in messages]
        text = self.tokenizer.apply_chat_template(
            dicts,
            tools=self.tools or None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no special tokens added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens (tool-call markup) kept."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of the first prompt, ending with the generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def delta_text(self, new_messages: Sequence[Message]) -> str:
        """Text that follows a model turn (ended by its eos) when ``new_messages`` are appended.

        With no new messages this is just the template's text after the eos and
        the next generation prompt.
        """
        full = self.render([*_BASE, *new_messages], add_generation_prompt=True)
        if not full.startswith(self._base_text):
            raise TemplateError(
                "the chat template re-renders earlier turns when messages are appended "
                "(not prefix-consistent); run `agentrl doctor tokenizer` for a diff"
            )
        return self._after_eot + full[len(self._base_text) :]

    def delta_ids(self, new_messages: Sequence[Message]) -> list[int]:
        """Token ids that follow a model turn when ``new_messages`` are appended."""
        return self.encode(self.delta_text(new_messages))

    def content_of(self, sampled_ids: Sequence[int]) -> str:
        """The assistant text of a sampled turn, without its trailing eos."""
        ids = list(sampled_ids)
        if ids and ids[-1] == self.eot_id:
            ids = ids[:-1]
        return self.decode(ids)
