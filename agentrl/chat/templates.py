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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.chat.capabilities import Capabilities, probe_capabilities
from agentrl.chat.consistency import PY_TOOL, ConsistencyReport, check_chat_template
from agentrl.chat.tokenization import (
    ChatTokenizer,
    TemplateError,
    TemplateRenderError,
)

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
    if c.tokens_ok:
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
    verdict = "consistent" if rep.tokens_ok else "not consistent"
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
