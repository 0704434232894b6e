"""What a chat template can do, and how to train on it: capabilities, verdict, strategy.

:func:`inspect_template` is what ``agentrl doctor tokenizer`` prints and what the
AgentLoop runs once at start-up. It answers three questions:

- **capabilities**: does the template render tool schemas, tool calls, tool
  results and the reasoning of the turn being generated? A template that drops
  schemas or calls (SmolLM2's plain ChatML) can still be trained with tools:
  ``inject_tools`` puts the schemas into the system message and the calls into
  the assistant text, in the Hermes format.
- **verdict**: ``consistent`` (deltas add up to the template's rendering of the
  whole conversation), ``not consistent`` (the template rewrites history, or a
  probe failed), or ``could not check`` (no usable template).
- **strategy**: ``as_sampled`` for a consistent template; for one that rewrites
  history, ``per_turn`` (each model turn trained on the prompt inference would
  show) when it holds, else ``as_sampled`` when its deltas hold; ``None`` (the loop
  refuses) when neither holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.chat.consistency import PY_TOOL, ConsistencyReport, check_chat_template
from agentrl.chat.tokenization import (
    ChatTokenizer,
    TemplateError,
    TemplateRenderError,
)
from agentrl.types import Message, ToolCall

__all__ = [
    "EXIT_CODES",
    "STRATEGIES",
    "Capabilities",
    "TemplateReport",
    "inspect_template",
    "probe_capabilities",
]

Strategy = Literal["as_sampled", "per_turn"]
STRATEGIES: tuple[str, ...] = ("as_sampled", "per_turn")
EXIT_CODES = {"consistent": 0, "not consistent": 1, "could not check": 3}
"""``agentrl doctor tokenizer`` exit status per verdict (2 is a usage error)."""

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
    probe._prompts = OrderedDict()  # its own: other tools render other prompt ids
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


@dataclass
class TemplateReport:
    """Everything the doctor says about one tokenizer's chat template.

    Attributes:
        verdict: "consistent", "not consistent" or "could not check".
        strategy: "as_sampled", "per_turn", or None when neither holds (refused).
        capabilities: What the template renders (None when it could not be probed).
        consistency: The per-turn check (with ``inject_tools`` when it applies).
        inject_tools: The Hermes tools fallback is needed (and was checked).
        eot_texts: The tokens a model turn ends on.
        error: Why the template could not be checked.
        fixes: What to do, one line each.
    """

    verdict: str
    strategy: str | None
    capabilities: Capabilities | None
    consistency: ConsistencyReport
    inject_tools: bool = False
    eot_texts: tuple[str, ...] = ()
    error: str = ""
    fixes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 consistent, 1 not consistent, 3 could not check."""
        return EXIT_CODES[self.verdict]

    def summary(self) -> str:
        """The doctor's text: per-turn details, then verdict, strategy and capabilities."""
        lines = [self.consistency.summary()] if self.consistency.results else []
        if self.error:
            lines.append(f"error: {self.error}")
        if self.eot_texts:
            lines.append("end-of-turn tokens: " + ", ".join(self.eot_texts))
        if self.capabilities is not None:
            lines.append(self.capabilities.line())
        if self.inject_tools:
            lines.append(
                "tools: the template drops them; inject_tools puts the schemas into the system "
                "message and the calls into the assistant text (Hermes format)"
            )
        lines.append(f"verdict: {self.verdict}")
        c = self.consistency
        holds = f"(as_sampled {'holds' if c.as_sampled_ok else 'does not hold'}, per_turn " + (
            "holds)" if c.per_turn_ok and c.checked and not c.errors else "does not hold)"
        )
        lines.append(f"strategy: {self.strategy or 'none (refused)'} {holds}")
        lines += [f"fix: {f}" for f in self.fixes]
        return "\n".join(lines)


def _strategy(c: ConsistencyReport) -> str | None:
    if c.ok:
        return "as_sampled"
    if c.checked and not c.errors and c.per_turn_ok:
        return "per_turn"
    if c.as_sampled_ok:
        return "as_sampled"
    return None


def inspect_template(
    tokenizer: Any,
    tools: Sequence[dict[str, Any]] = (PY_TOOL,),
    *,
    inject_tools: bool | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> TemplateReport:
    """Capabilities, verdict and strategy of ``tokenizer``'s chat template.

    Args:
        tokenizer: A Hugging Face tokenizer.
        tools: Tool schemas to render (the env's, or a python tool).
        inject_tools: Force the Hermes tools fallback on/off; None: on when the
            template drops tool schemas or calls.
        template_kwargs: Extra template variables (e.g. ``enable_thinking``).
    """
    try:
        chat = ChatTokenizer(tokenizer, tools=tools, template_kwargs=template_kwargs)
    except TemplateError as e:
        rep = ConsistencyReport(errors={"template": str(e)}, per_turn_ok=False)
        fix = "give the model directory a chat template (chat_template.jinja) that closes "
        fix += "each assistant turn with its end-of-turn token"
        if isinstance(e, TemplateRenderError):
            fix = "the template raises on a plain question and answer (its message is above): "
            fix += "fix it, or replace chat_template.jinja with the family's published template"
        return TemplateReport("could not check", None, None, rep, error=str(e), fixes=[fix])
    caps = probe_capabilities(chat)
    inject = caps.drops_tools if inject_tools is None else inject_tools
    if inject:
        chat = ChatTokenizer(
            tokenizer, tools=tools, inject_tools=True, template_kwargs=template_kwargs
        )
    rep = check_chat_template(tokenizer, tools=tools, inject_tools=inject, chat=chat)
    verdict = "consistent" if rep.ok else "not consistent"
    if not rep.checked:
        verdict = "could not check"
    strategy = _strategy(rep)
    fixes = []
    if strategy is None:
        fixes.append(
            "neither strategy holds: a turn's delta cannot be isolated and the template "
            "raises or does not place the model's turn after its generation prompt; fix the "
            "template (see the errors above)"
        )
    elif verdict == "not consistent":
        fixes.append(
            f"training uses {strategy}; set rollout.template_strategy to override "
            f"({' or '.join(STRATEGIES)})"
        )
    if caps.drops_tools and not inject:
        fixes.append("the template drops tools: set rollout.inject_tools: true")
    return TemplateReport(verdict, strategy, caps, rep, inject, chat.eot_texts, "", fixes)
