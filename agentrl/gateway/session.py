"""One episode behind the gateway: its exact token history, kept as segments.

Each chat request's messages are matched, message by message, against what the
session recorded: the messages of earlier requests and the assistant replies
the gateway returned. When the request *extends* the record (same earlier
messages; assistant messages compared by content and tool calls), the recorded
token ids are reused as they are — earlier assistant turns are the exact
sampled ids, never re-tokenized text — and only the new messages are rendered
(:meth:`ChatTokenizer.delta_ids`). Anything else (an edited, truncated or
summarized history, other tools) starts a new *segment*: its own prompt, its
own training sample, counted (``gateway/rewrites``). Text completions match the
same way on the prompt text (or token ids).

With the ``per_turn`` template strategy (a template that rewrites history, see
``agentrl doctor tokenizer``) every request is its own sample, prompted exactly
as the template renders its messages; that is not counted as a rewrite.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import replace
from typing import Any

from agentrl.chat.tokenization import ChatTokenizer, TemplateError
from agentrl.gateway.limits import (
    GatewayLimits,
    canon,
    extends,
    kept,
    over_budget_message,
)
from agentrl.gateway.openai_api import ApiError, ChatRequest, CompletionRequest, Sampling
from agentrl.gateway.record import Segment, to_trajectory
from agentrl.gateway.responses import Reply
from agentrl.gateway.templates import Templates
from agentrl.inference.protocol import Generation, LLMClient, LLMError, SamplingParams
from agentrl.types import Message, StopReason, ToolCall, Trajectory

__all__ = ["GatewayLimits", "Session"]


_DEFAULT_ID = re.compile(r"call_\d+")


class Session:
    """The gateway's record of one episode.

    Args:
        episode_id: Also the router's session id (one server per episode).
        llm: Where generations come from.
        templates: The run's shared templates and turn parser.
        limits: The run's limits.
    """

    def __init__(
        self, episode_id: str, llm: LLMClient, templates: Templates, limits: GatewayLimits
    ) -> None:
        self.episode_id = episode_id
        self.llm = llm
        self.templates = templates
        self.limits = limits
        self.segments: list[Segment] = []
        self.turns = 0
        self.stop_reason: StopReason | None = None
        self.error: str | None = None
        self.conversation: list[dict[str, Any]] = []
        self.metrics: dict[str, float] = {}
        self.closed = False
        self.token = ""
        self.last_api_error: str | None = None
        self.fatal = False  # the gateway ended the episode; the agent's error follows from it
        self.cut_by_budget = False  # the last reply was cut by the run's token budget
        self.responses: dict[str, list[Message]] = {}  # Responses API: conversation by id
        self._lock = asyncio.Lock()
        self._inflight: set[asyncio.Future[Generation]] = set()

    # ------------------------------------------------------------------ helpers

    def count(self, key: str, n: float = 1.0) -> None:
        """Adds ``n`` to the episode metric ``key``."""
        self.metrics[key] = self.metrics.get(key, 0.0) + n

    def end(self, reason: StopReason, error: str | None = None) -> None:
        """Records why the episode ends (the first reason wins)."""
        if self.stop_reason is None:
            self.stop_reason, self.error = reason, error

    def _check_open(self) -> None:
        if self.closed:
            raise ApiError(404, f"session {self.episode_id!r} ended", code="session_ended")

    def _params(self, s: Sampling, context: int, chat: ChatTokenizer) -> SamplingParams | None:
        """Sampling parameters within the run's limits; None when the budget is spent."""
        lim, loop = self.limits, self.limits.loop
        if self.turns >= loop.max_turns:
            self.end(StopReason.MAX_TURNS)
            return None
        room = min(loop.max_tokens_per_turn, loop.max_total_tokens - context)
        if room <= 0:
            self.end(StopReason.MAX_TOKENS)
            return None
        temperature = loop.sampling.temperature if s.temperature is None else s.temperature
        if temperature > lim.max_temperature:
            temperature = lim.max_temperature
            if s.temperature is not None:  # the agent asked for more than the run allows
                self.count("gateway/clamped_params")
        if s.max_tokens is not None and s.max_tokens > loop.max_tokens_per_turn:
            self.count("gateway/clamped_params")
        stops = loop.sampling.stop_token_ids
        extra = tuple(i for i in chat.eot_ids if i not in stops)
        if extra and extra != (self.templates.tokenizer.eos_token_id,):
            stops = (*stops, *extra)  # families that end a turn on more than eos
        return replace(
            loop.sampling,
            max_tokens=room if s.max_tokens is None else min(s.max_tokens, room),
            temperature=temperature,
            top_p=loop.sampling.top_p if s.top_p is None else s.top_p,
            seed=loop.sampling.seed if s.seed is None else s.seed,
            stop_token_ids=stops,
        )

    def _length_reply(self, context: int) -> Reply:
        self.count("gateway/length_replies")
        self.cut_by_budget = True
        return Reply("", (), "length", [], [], context, 0, self.limits.model_name)

    async def _generate(self, context: list[int], params: SamplingParams) -> Generation:
        fut = asyncio.ensure_future(self.llm.generate(context, params, session_id=self.episode_id))
        self._inflight.add(fut)
        t0 = time.perf_counter()
        try:
            gen = await fut
        except asyncio.CancelledError:
            if fut.cancelled() and self.closed:
                self._check_open()
            raise
        except LLMError as e:
            self.end(StopReason.LLM_ERROR, str(e))
            raise ApiError(503, f"inference failed: {e}", code="llm_error") from e
        finally:
            self._inflight.discard(fut)
            self.count("generate_time_s", time.perf_counter() - t0)
        n = len(gen.token_ids)
        versions = gen.weight_versions or [0] * n
        if len(gen.logprobs) != n or len(versions) != n:
            msg = (
                f"server returned {n} tokens, {len(gen.logprobs)} logprobs, "
                f"{len(versions)} versions"
            )
            self.end(StopReason.LLM_ERROR, msg)
            raise ApiError(503, f"inference failed: {msg}", code="llm_error")
        self._check_open()
        return replace(gen, weight_versions=list(versions))

    def _reply(
        self, gen: Generation, content: str, calls: tuple[ToolCall, ...], finish: str,
        context: int, reasoning: str = "", stop: str | None = None,
    ) -> Reply:  # fmt: skip
        tok = self.templates.tokenizer
        tokens = [str(t) for t in tok.convert_ids_to_tokens(list(gen.token_ids))]
        return Reply(
            content, calls, finish, tokens, list(gen.logprobs), context, len(gen.token_ids),
            self.limits.model_name, reasoning, stop,
        )  # fmt: skip

    def _new_segment(self, seg: Segment) -> None:
        if self.segments and self.limits.strategy != "per_turn":
            seg.rewrite = True
            self.count("gateway/rewrites")
        self.segments.append(seg)

    def _note_cut(self, finish: str, asked: Sampling, params: SamplingParams) -> None:
        """Whether this reply was cut by the run's token budget (not the agent's own cap)."""
        self.cut_by_budget = finish == "length" and (
            asked.max_tokens is None or asked.max_tokens > params.max_tokens
        )

    def _check_budget(self, context: int) -> None:
        """A first prompt that leaves nothing to generate ends the episode (``max_tokens``),
        with a message naming the settings to raise, instead of empty ``length`` replies."""
        if self.turns == 0 and context >= self.limits.loop.max_total_tokens:
            msg = over_budget_message(context, self.limits)
            self.end(StopReason.MAX_TOKENS, msg)
            self.fatal = True
            self.count("gateway/prompt_over_budget")
            raise ApiError(400, msg, param="messages", code="context_length_exceeded")

    # ------------------------------------------------------------------ requests

    def _extend(self, req: ChatRequest, key: str) -> tuple[Segment, list[int], list[int]] | None:
        """(segment, closing ids, delta ids) when ``req`` extends the current segment."""
        cur = self.segments[-1] if self.segments else None
        if (
            cur is None
            or cur.kind != "chat"
            or cur.chat is None
            or cur.tools_key != key
            or self.limits.strategy == "per_turn"
            or not extends(cur.messages, req.messages)
        ):
            return None
        chat = cur.chat
        new = list(req.messages[len(cur.messages) :])
        # A turn that ended without its end-of-turn token (stop string, length) is closed
        # as the template would, with a token the model did not sample.
        close = [] if cur.token_ids[-1] in chat.eot_ids else [chat.eot_id]
        try:
            delta = chat.delta_ids(new, after=cur.messages[-1])
        except TemplateError:
            return None  # cannot extend exactly: a counted new segment instead
        return cur, close, delta

    def _opening(self, req: ChatRequest) -> str:
        """The text put, untrained, at the start of a forced turn ("prefill"), else ""."""
        if req.tool_choice != "required" or self.limits.forced_tool_choice != "prefill":
            return ""
        tag = getattr(getattr(self.templates.parser, "tools", None), "start_tag", None)
        return tag if isinstance(tag, str) else ""

    def _parse(self, req: ChatRequest, text: str, finish: str) -> tuple[str, str, Any]:
        """(content, reasoning, parsed or None) of a turn's text."""
        use_tools = bool(req.tools) and req.tool_choice != "none"
        if finish == "length":
            return text, "", None
        parsed = self.templates.parse(text, req.tools if use_tools else [])
        if not use_tools:
            return (parsed.content if parsed.reasoning else text), parsed.reasoning, None
        if parsed.errors:  # the agent sees what the model wrote
            return text, parsed.reasoning, parsed
        return parsed.content, parsed.reasoning, parsed

    async def _turn(
        self, req: ChatRequest, chat: ChatTokenizer, context: list[int], opening: list[int],
        params: SamplingParams,
    ) -> tuple[Generation, str, str, str | None, str, str, Any]:  # fmt: skip
        """One model turn; a forced tool choice resamples it until it holds a call of an
        allowed function (``forced_tool_choice_tries`` at most; the last is kept)."""
        forced = req.tool_choice == "required"
        tries = self.limits.forced_tool_choice_tries if forced else 1
        prefix = chat.decode(opening) if opening else ""
        for attempt in range(tries):
            p = params
            if attempt and params.seed is not None:  # the same seed would sample it again
                p = replace(params, seed=params.seed + attempt)
            gen = await self._generate([*context, *opening], p)
            gen, text, finish, stop = kept(chat, gen, req.sampling.stop)
            content, reasoning, parsed = self._parse(req, prefix + text, finish)
            if not forced:
                break
            calls = parsed.tool_calls if parsed is not None and not parsed.errors else ()
            if calls and all(req.tool_name in (None, c.name) for c in calls):
                break
            if attempt + 1 < tries:
                self.count("gateway/tool_choice_resamples")
            else:
                self.count("gateway/tool_choice_unmet")
        return gen, text, finish, stop, content, reasoning, parsed

    async def chat(self, req: ChatRequest) -> Reply:
        """Answers one chat request, recording its tokens exactly."""
        async with self._lock:
            self._check_open()
            key = canon(req.tools)
            ext = self._extend(req, key)
            if ext is not None:
                cur, close, delta = ext
                assert cur.chat is not None
                chat, context = cur.chat, [*cur.token_ids, *close, *delta]
            else:
                chat = self.templates.chat(req.tools, key)
                try:
                    context = chat.prompt_ids(req.messages)
                except TemplateError as e:
                    raise ApiError(
                        400, f"the chat template cannot render these messages: {e}",
                        param="messages",
                    ) from e  # fmt: skip
            self._check_budget(len(context))
            forced_open = self._opening(req)
            opening = chat.encode(forced_open) if forced_open else []
            params = self._params(req.sampling, len(context) + len(opening), chat)
            if params is None:
                return self._length_reply(len(context))
            gen, _text, finish, stop, content, reasoning, parsed = await self._turn(
                req, chat, context, opening, params
            )
            self._note_cut(finish, req.sampling, params)

            if ext is None:
                seg = Segment("chat", key, chat, list(req.messages))
                seg.add(context, "prompt")
                seg.prompt_length = len(context)
                self._new_segment(seg)
            else:
                seg = cur
                seg.add(close, "observation")
                seg.add(delta, "observation")
                seg.messages.extend(req.messages[len(seg.messages) :])
            seg.add_model(gen.token_ids, gen.logprobs, gen.weight_versions, inserted=opening)
            self.turns += 1

            calls: tuple[ToolCall, ...] = ()
            if parsed is not None:
                calls = tuple(
                    replace(c, id=f"call_{self.turns}_{i}")
                    if not c.id or _DEFAULT_ID.fullmatch(c.id)
                    else c  # a family's native ids (Mistral, Kimi) are kept
                    for i, c in enumerate(parsed.tool_calls)
                )
                if parsed.errors:
                    self.count("gateway/tool_parse_errors", len(parsed.errors))
            if calls:
                finish = "tool_calls"
            seg.messages.append(Message("assistant", content, calls, reasoning=reasoning))
            reply: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                reply["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                    for c in calls
                ]  # fmt: skip
            self.conversation = [*req.raw_messages, reply]
            return self._reply(gen, content, calls, finish, len(context), reasoning, stop)

    async def complete(self, req: CompletionRequest) -> Reply:
        """Answers one text-completion request, recording its tokens exactly."""
        async with self._lock:
            self._check_open()
            chat = self.templates.chat([], "[]")
            cur = self.segments[-1] if self.segments else None
            if cur is not None and cur.kind != "text":
                cur = None
            prompt = req.prompt
            if isinstance(prompt, str):
                if cur is not None and prompt.startswith(cur.text):
                    delta = chat.encode(prompt[len(cur.text) :])
                else:
                    cur, delta = None, chat.encode(prompt)
            elif cur is not None and prompt[: len(cur.token_ids)] == cur.token_ids:
                delta = list(prompt[len(cur.token_ids) :])
            else:
                cur, delta = None, list(prompt)
            context = [*(cur.token_ids if cur else []), *delta]
            self._check_budget(len(context))
            params = self._params(req.sampling, len(context), chat)
            if params is None:
                return self._length_reply(len(context))
            gen = await self._generate(context, params)
            gen, text, finish, stop = kept(chat, gen, req.sampling.stop)
            self._note_cut(finish, req.sampling, params)
            prompt_text = prompt if isinstance(prompt, str) else chat.decode(prompt)
            if cur is None:
                cur = Segment("text", text=prompt_text)
                cur.add(delta, "prompt")
                cur.prompt_length = len(delta)
                self._new_segment(cur)
            else:
                cur.add(delta, "observation")
                cur.text = prompt_text
            cur.add_model(gen.token_ids, gen.logprobs, gen.weight_versions)
            cur.text += text
            self.turns += 1
            self.conversation = [{"role": "user", "content": cur.text}]
            return self._reply(gen, text, (), finish, len(context), stop=stop)

    def close(self) -> None:
        """Ends the session: later requests get 404; in-flight generations are cancelled."""
        self.closed = True
        for fut in list(self._inflight):
            fut.cancel()

    def trajectory(
        self, *, task_id: str, group_id: str, reward: float, stop_reason: StopReason,
        error: str | None = None,
    ) -> Trajectory:  # fmt: skip
        """The episode's Trajectory: each segment one sample (see :mod:`agentrl.gateway.record`)."""
        return to_trajectory(
            self.segments, task_id=task_id, group_id=group_id, episode_id=self.episode_id,
            reward=reward, stop_reason=stop_reason, error=error, metrics=self.metrics,
            strategy=self.limits.strategy,
        )  # fmt: skip
