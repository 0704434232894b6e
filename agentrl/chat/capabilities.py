"""What a chat template renders and what it silently drops: tool schemas, calls, results,
the reasoning of the turn being generated (``agentrl doctor tokenizer``'s capability line).

A template that drops schemas or calls (SmolLM2's plain ChatML) can still be trained
with tools: ``inject_tools`` puts the schemas into the system message and the calls
into the assistant text, in the Hermes format.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.chat.prompt_cache import PromptCache
from agentrl.chat.tokenization import ChatTokenizer, TemplateRenderError
from agentrl.types import Message, ToolCall

__all__ = ["PY_TOOL", "Capabilities", "probe_capabilities"]

PY_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code."}},
            "required": ["code"],
        },
    },
}
"""A python tool's schema: what the probes render when no tools are given."""

_CALL = ToolCall("python", {"code": "print(31337)"}, id="call_0")
_RESULT = "tool-result-27182"
_REASONING = "reasoning-16180"


@dataclass(frozen=True)
class Capabilities:
    """What a template renders (True) or silently drops (False); None: could not tell.

    Attributes:
        tool_schemas: The tools passed to the template appear in the prompt.
        tool_calls: An assistant turn's tool calls appear in its text.
        tool_results: A tool message's content appears.
        reasoning: The ``<think>`` reasoning of the turn being generated appears.
        notes: How calls must be passed (one per turn, 9-character ids, arguments
            as a string) and template errors met while probing.
    """

    tool_schemas: bool | None
    tool_calls: bool | None
    tool_results: bool | None
    reasoning: bool | None
    notes: tuple[str, ...] = ()

    @property
    def drops_tools(self) -> bool:
        """Schemas or calls are dropped: training with tools needs ``inject_tools``."""
        return self.tool_schemas is False or self.tool_calls is False

    def line(self) -> str:
        """One line for humans."""

        def yn(v: bool | None, what: str) -> str:
            return f"{what} " + {True: "yes", False: "DROPPED", None: "?"}[v]

        parts = [
            yn(self.tool_schemas, "tool schemas"),
            yn(self.tool_calls, "tool calls"),
            yn(self.tool_results, "tool results"),
            yn(self.reasoning, "reasoning of the last turn"),
        ]
        return "capabilities: " + ", ".join(parts) + "".join(f"; {n}" for n in self.notes)


def probe_capabilities(chat: ChatTokenizer) -> Capabilities:
    """Renders small probes through ``chat``'s template (its tools, else a python tool)."""
    tools = chat.tools or [PY_TOOL]
    probe = ChatTokenizer.__new__(ChatTokenizer)
    probe.__dict__.update(chat.__dict__)
    probe.tools, probe.inject_tools = list(tools), False
    probe.prompt_cache = PromptCache()  # its own: other tools render other prompt ids
    u = Message.user("Hi.")
    notes: list[str] = []
    style = chat.style
    if style.single_call:
        notes.append("one tool call per turn")
    if style.nine_char_ids:
        notes.append("9-character call ids (mapped from the parser's)")
    if style.arguments_as_string:
        notes.append("arguments passed as a JSON string")

    def has(msgs: list[Message], needle: str, what: str) -> bool | None:
        try:
            return needle in probe.render(msgs, what=what)
        except TemplateRenderError as e:
            notes.append(f"raises on {what}: {e.template_message}")
            return None

    fn = tools[0].get("function", tools[0])
    schemas = has([u], str(fn.get("name", "")), "the tool schemas")
    if schemas and fn.get("description"):
        schemas = has([u], str(fn["description"]), "the tool schemas")
    calls = results = None
    if style.renders_calls:
        calls = has([u, Message.assistant("", (_CALL,))], "31337", "an assistant tool call")
        results = has(
            [
                u,
                Message.assistant("", (_CALL,)),
                Message.tool(_RESULT, tool_call_id=_CALL.id, name=_CALL.name),
            ],
            _RESULT,
            "a tool result",
        )
    else:
        calls = False  # treated as dropped: inject_tools writes calls into the text
        notes.append(f"raises on tool calls: {style.error}")
    reasoning = has(
        [u, Message.assistant(f"<think>{_REASONING}</think>Done.")],
        _REASONING,
        "an answer with reasoning",
    )
    return Capabilities(schemas, calls, results, reasoning, tuple(notes))
