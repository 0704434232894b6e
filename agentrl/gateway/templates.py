"""The templates of a run, shared by every session: one ChatTokenizer per tool set, and
the run's turn parser (tool calls and reasoning)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from agentrl.chat.tokenization import ChatTokenizer, TemplateError
from agentrl.gateway.openai_api import ApiError
from agentrl.tools import make_turn_parser

__all__ = ["Templates"]


class Templates:
    """One ChatTokenizer per tool set, shared by every session (building one probes the
    template), and the run's turn parser.

    Args:
        tokenizer: The policy's tokenizer.
        tool_parser: The run's tool-call parser name.
        reasoning_parser: The run's reasoning parser name (None: none).
        inject_tools: Hermes-format tools for a template that drops them.
        parser: A turn parser to use instead of the one the names give.
        size: Most tool sets kept.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        tool_parser: str = "hermes",
        reasoning_parser: str | None = None,
        inject_tools: bool = False,
        parser: Any = None,
        size: int = 64,
    ) -> None:
        self.tokenizer = tokenizer
        self.inject_tools = inject_tools
        self.parser = parser or make_turn_parser(tool_parser, reasoning_parser, tokenizer)
        self.size = size
        self._chats: OrderedDict[str, ChatTokenizer] = OrderedDict()

    def chat(self, tools: list[dict[str, Any]], key: str) -> ChatTokenizer:
        """The ChatTokenizer rendering ``tools`` (``key``: their canonical JSON)."""
        if key in self._chats:
            self._chats.move_to_end(key)
            return self._chats[key]
        try:
            chat = ChatTokenizer(self.tokenizer, tools=tools, inject_tools=self.inject_tools)
        except TemplateError as e:
            raise ApiError(400, f"cannot render these tools: {e}", param="tools") from e
        self._chats[key] = chat
        if len(self._chats) > self.size:
            self._chats.popitem(last=False)
        return chat

    def parse(self, text: str, tools: list[dict[str, Any]]) -> Any:
        """The turn parser's output for ``text`` with ``tools``."""
        bind = getattr(self.parser, "with_tools", None)
        parser = bind(tools) if callable(bind) else self.parser
        return parser.parse(text)
