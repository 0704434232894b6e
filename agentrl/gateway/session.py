"""One episode behind the gateway: its exact token history, kept as segments.

Each chat request's messages are matched, message by message, against what the
session recorded: the messages of earlier requests and the assistant replies
the gateway returned. When the request *extends* the record (same earlier
messages; assistant messages compared by content and tool calls), the recorded
token ids are reused as they are — earlier assistant turns are the exact
sampled ids, never re-tokenized text — and only the new messages are rendered
(:meth:`ChatTokenizer.delta_ids`). Anything else (an edited, truncated or
summarized history, other tools) starts a new *segment*: its own prompt, its
own training sample, counted in ``gateway/segments``. Text completions match
the same way on the prompt text (or token ids).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.gateway.openai_api import ApiError, ChatRequest, CompletionRequest, Reply, Sampling
from agentrl.llm import Generation, LLMClient, LLMError, SamplingParams
from agentrl.rollout.tokenization import ChatTokenizer, TemplateError
from agentrl.tools import ToolCallParser, get_parser
from agentrl.types import Message, StopReason, ToolCall, Trajectory, TurnSpan

__all__ = ["GatewayLimits", "Segment", "Session"]


@dataclass(frozen=True)
class GatewayLimits:
    """The run's limits on what an agent may ask for.

    Attributes:
        max_turns: Most model calls per episode; later calls get a ``length`` finish.
        max_total_tokens: Context budget of one segment (prompt + every turn).
        max_tokens_per_turn: Most tokens one call may generate (an agent's
            ``max_tokens`` may only lower it).
        max_temperature: An agent's temperature above this is lowered to it.
        sampling: Defaults for what the agent does not send.
        tool_parser: Name of the run's tool-call parser.
        model_name: The model id ``GET /v1/models`` lists (any ``model`` is accepted).
    """

    max_turns: int = 8
    max_total_tokens: int = 4096
    max_tokens_per_turn: int = 1024
    max_temperature: float = 2.0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tool_parser: str = "hermes"
    model_name: str = "agentrl-policy"


@dataclass
class Segment:
    """One contiguous token history: a training sample.

    Attributes:
        kind: "chat" or "text" (``/v1/completions``).
        tools_key: Canonical JSON of the tools rendered into its prompt.
        chat: Renders the template with those tools.
        messages: Chat: the recorded conversation (requests' messages, replies).
        text: Text: the prompt text so far and the replies.
    """

    kind: str
    tools_key: str = "[]"
    chat: ChatTokenizer | None = None
    messages: list[Message] = field(default_factory=list)
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    spans: list[TurnSpan] = field(default_factory=list)
    prompt_length: int = 0
    turns: int = 0

    def add(self, ids: Sequence[int], kind: str) -> None:
        """Appends tokens the model did not sample (loss mask 0)."""
        if not ids:
            return
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.versions.extend([-1] * len(ids))
        self.spans.append(TurnSpan(start, len(self.token_ids), kind))

    def add_model(
        self, ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]
    ) -> None:
        """Appends sampled tokens with their logprobs and weight versions."""
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs)
        self.versions.extend(versions)
        self.spans.append(TurnSpan(start, len(self.token_ids), "model"))
        self.turns += 1


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)


def _key(m: Message) -> tuple[Any, ...]:
    calls = tuple((c.name, _canon(c.arguments)) for c in m.tool_calls)
    if m.role == "assistant":  # as the gateway returned it; clients drop ids and whitespace
        return ("assistant", m.content.strip(), calls)
    return (m.role, m.content, calls, m.tool_call_id or "", m.name or "")


def _extends(recorded: Sequence[Message], request: Sequence[Message]) -> bool:
    return len(request) >= len(recorded) and all(
        _key(a) == _key(b) for a, b in zip(recorded, request, strict=False)
    )


def _cut_at_stop(
    chat: ChatTokenizer, ids: list[int], stops: Sequence[str]
) -> tuple[int, str] | None:
    """(tokens to keep, text before the stop string) at the first stop string, else None."""
    if not stops or not any(s in chat.decode(ids) for s in stops):
        return None
    for k in range(1, len(ids) + 1):
        text = chat.decode(ids[:k])
        hits = [i for s in stops if (i := text.find(s)) >= 0]
        if hits:
            return k, text[: min(hits)]
    return None


class Session:
    """The gateway's record of one episode.

    Args:
        episode_id: Also the router's session id (one server per episode).
        llm: Where generations come from.
        tokenizer: The policy's tokenizer (with its chat template).
        limits: The run's limits.
        parser: The run's tool-call parser (default: ``get_parser(limits.tool_parser)``).
    """

    def __init__(
        self,
        episode_id: str,
        llm: LLMClient,
        tokenizer: Any,
        limits: GatewayLimits,
        parser: ToolCallParser | None = None,
    ) -> None:
        self.episode_id = episode_id
        self.llm = llm
        self.tokenizer = tokenizer
        self.limits = limits
        self.parser = parser or get_parser(limits.tool_parser)
        self.segments: list[Segment] = []
        self.turns = 0
        self.stop_reason: StopReason | None = None
        self.error: str | None = None
        self.conversation: list[dict[str, Any]] = []
        self.metrics: dict[str, float] = {}
        self.closed = False
        self.token = ""
        self.last_api_error: str | None = None
        self._lock = asyncio.Lock()
        self._chats: dict[str, ChatTokenizer] = {}
        self._inflight: set[asyncio.Future[Generation]] = set()

    # ------------------------------------------------------------------ helpers

    def count(self, key: str, n: float = 1.0) -> None:
        """Adds ``n`` to the episode metric ``key``."""
        self.metrics[key] = self.metrics.get(key, 0.0) + n

    def _chat(self, tools: list[dict[str, Any]], key: str) -> ChatTokenizer:
        if key not in self._chats:
            try:
                self._chats[key] = ChatTokenizer(self.tokenizer, tools=tools)
            except TemplateError as e:
                raise ApiError(400, f"cannot render these tools: {e}", param="tools") from e
        return self._chats[key]

    def end(self, reason: StopReason, error: str | None = None) -> None:
        """Records why the episode ends (the first reason wins)."""
        if self.stop_reason is None:
            self.stop_reason, self.error = reason, error

    def _params(self, s: Sampling, context: int) -> SamplingParams | None:
        """Sampling parameters within the run's limits; None when the budget is spent."""
        lim = self.limits
        if self.turns >= lim.max_turns:
            self.end(StopReason.MAX_TURNS)
            return None
        room = min(lim.max_tokens_per_turn, lim.max_total_tokens - context)
        if room <= 0:
            self.end(StopReason.MAX_TOKENS)
            return None
        max_tokens = room if s.max_tokens is None else min(s.max_tokens, room)
        temperature = lim.sampling.temperature if s.temperature is None else s.temperature
        if temperature > lim.max_temperature:
            temperature = lim.max_temperature
            if s.temperature is not None:  # the agent asked for more than the run allows
                self.count("gateway/clamped_params")
        if s.max_tokens is not None and s.max_tokens > lim.max_tokens_per_turn:
            self.count("gateway/clamped_params")
        return replace(
            lim.sampling,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=lim.sampling.top_p if s.top_p is None else s.top_p,
            seed=lim.sampling.seed if s.seed is None else s.seed,
        )

    def _length_reply(self, context: int) -> Reply:
        self.count("gateway/length_replies")
        return Reply("", (), "length", [], [], context, 0, self.limits.model_name)

    async def _generate(self, context: list[int], params: SamplingParams) -> Generation:
        fut = asyncio.ensure_future(self.llm.generate(context, params, session_id=self.episode_id))
        self._inflight.add(fut)
        t0 = time.perf_counter()
        try:
            gen = await fut
        except asyncio.CancelledError:
            if fut.cancelled() and self.closed:
                raise ApiError(
                    404, f"session {self.episode_id!r} ended", code="session_ended"
                ) from None
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
        if self.closed:
            raise ApiError(404, f"session {self.episode_id!r} ended", code="session_ended")
        return replace(gen, weight_versions=list(versions))

    def _sampled(
        self, chat: ChatTokenizer, gen: Generation, stops: Sequence[str]
    ) -> tuple[Generation, str, str]:
        """The kept tokens (cut after a stop string), their text and the finish reason."""
        ids = list(gen.token_ids)
        body = ids[:-1] if ids and ids[-1] == chat.eot_id else ids
        cut = _cut_at_stop(chat, body, stops)
        if cut is not None:
            k, text = cut
            gen = replace(
                gen, token_ids=ids[:k], logprobs=gen.logprobs[:k],
                weight_versions=gen.weight_versions[:k],
            )  # fmt: skip
            return gen, text, "stop"
        return gen, chat.decode(body), "length" if gen.finish_reason == "length" else "stop"

    def _reply(
        self, gen: Generation, content: str, calls: tuple[ToolCall, ...], finish: str, context: int
    ) -> Reply:
        tokens = [str(t) for t in self.tokenizer.convert_ids_to_tokens(list(gen.token_ids))]
        return Reply(
            content, calls, finish, tokens, list(gen.logprobs), context, len(gen.token_ids),
            self.limits.model_name,
        )  # fmt: skip

    # ------------------------------------------------------------------ requests

    async def chat(self, req: ChatRequest) -> Reply:
        """Answers one chat request, recording its tokens exactly."""
        async with self._lock:
            if self.closed:
                raise ApiError(404, f"session {self.episode_id!r} ended", code="session_ended")
            tools_key = _canon(req.tools)
            cur = self.segments[-1] if self.segments else None
            new: list[Message] = []
            context: list[int]
            if (
                cur is not None
                and cur.kind == "chat"
                and cur.chat is not None
                and cur.tools_key == tools_key
                and _extends(cur.messages, req.messages)
            ):
                chat = cur.chat
                new = list(req.messages[len(cur.messages) :])
                # A turn that ended without its end-of-turn token (stop string, length) is
                # closed as the template would, with a token the model did not sample.
                close = [] if cur.token_ids[-1] == chat.eot_id else [chat.eot_id]
                try:
                    delta = chat.delta_ids(new)
                except TemplateError:
                    cur = None  # cannot extend exactly: a counted new segment instead
                else:
                    context = [*cur.token_ids, *close, *delta]
            else:
                cur = None
            if cur is None:
                chat = self._chat(req.tools, tools_key)
                try:
                    prompt = chat.prompt_ids(req.messages)
                except Exception as e:  # the template refuses this conversation
                    raise ApiError(
                        400,
                        f"the chat template cannot render these messages: {e}",
                        param="messages",
                    ) from e
                context = prompt
            params = self._params(req.sampling, len(context))
            if params is None:
                return self._length_reply(len(context))
            gen = await self._generate(context, params)
            gen, text, finish = self._sampled(chat, gen, req.sampling.stop)

            if cur is None:
                if self.segments:
                    self.count("gateway/rewrites")
                seg = Segment("chat", tools_key, chat, list(req.messages))
                seg.add(prompt, "prompt")
                seg.prompt_length = len(prompt)
                self.segments.append(seg)
            else:
                seg = cur
                seg.add(close, "observation")
                seg.add(delta, "observation")
                seg.messages.extend(new)
            seg.add_model(gen.token_ids, gen.logprobs, gen.weight_versions)
            self.turns += 1

            content = text
            calls: tuple[ToolCall, ...] = ()
            if req.tools and req.tool_choice != "none" and finish != "length":
                parsed = self.parser.parse(text)
                calls = tuple(
                    replace(c, id=f"call_{self.turns}_{i}") for i, c in enumerate(parsed.tool_calls)
                )
                if parsed.errors:
                    self.count("gateway/tool_parse_errors", len(parsed.errors))
                else:
                    content = parsed.content
            if calls:
                finish = "tool_calls"
            assistant = Message.assistant(content, calls)
            seg.messages.append(assistant)
            reply_dict: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                reply_dict["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                    for c in calls
                ]  # fmt: skip
            self.conversation = [*req.raw_messages, reply_dict]
            return self._reply(gen, content, calls, finish, len(context))

    async def complete(self, req: CompletionRequest) -> Reply:
        """Answers one text-completion request, recording its tokens exactly."""
        async with self._lock:
            if self.closed:
                raise ApiError(404, f"session {self.episode_id!r} ended", code="session_ended")
            chat = self._chat([], "[]")
            cur = self.segments[-1] if self.segments else None
            if cur is not None and cur.kind != "text":
                cur = None
            delta: list[int] = []
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
            params = self._params(req.sampling, len(context))
            if params is None:
                return self._length_reply(len(context))
            gen = await self._generate(context, params)
            gen, text, finish = self._sampled(chat, gen, req.sampling.stop)
            if cur is None:
                if self.segments:
                    self.count("gateway/rewrites")
                cur = Segment(
                    "text", text=prompt if isinstance(prompt, str) else chat.decode(prompt)
                )
                cur.add(delta, "prompt")
                cur.prompt_length = len(delta)
                self.segments.append(cur)
            else:
                cur.add(delta, "observation")
                cur.text = prompt if isinstance(prompt, str) else chat.decode(prompt)
            cur.add_model(gen.token_ids, gen.logprobs, gen.weight_versions)
            cur.text += text
            self.turns += 1
            self.conversation = [{"role": "user", "content": cur.text}]
            return self._reply(gen, text, (), finish, len(context))

    def close(self) -> None:
        """Ends the session: later requests get 404; in-flight generations are cancelled."""
        self.closed = True
        for fut in list(self._inflight):
            fut.cancel()

    # ------------------------------------------------------------------ records

    def trajectories(
        self,
        *,
        task_id: str,
        group_id: str,
        reward: float,
        stop_reason: StopReason,
        error: str | None = None,
    ) -> list[Trajectory]:
        """One Trajectory per segment (at least one), linked by ``info["episode_id"]``.

        Every segment carries the episode's reward (on its last model turn) and
        stop reason; episode-wide metrics sit on the first.
        """
        segs = [s for s in self.segments if s.token_ids] or [Segment("chat")]
        out = []
        for i, s in enumerate(segs):
            eid = self.episode_id if i == 0 else f"{self.episode_id}#{i}"
            spans = [replace(sp) for sp in s.spans]
            model = [sp for sp in spans if sp.kind == "model"]
            if model:
                model[-1].reward = reward
            metrics = dict(self.metrics) if i == 0 else {}
            metrics["gateway/segments"] = 1.0
            t = Trajectory(
                task_id=task_id,
                group_id=group_id,
                episode_id=eid,
                token_ids=list(s.token_ids),
                loss_mask=list(s.loss_mask),
                rollout_logprobs=list(s.logprobs),
                weight_versions=list(s.versions),
                prompt_length=s.prompt_length,
                spans=spans,
                reward=reward,
                stop_reason=stop_reason,
                messages=list(s.messages) if s.kind == "chat" else [Message.user(s.text)],
                num_turns=s.turns,
                metrics=metrics,
                info={"episode_id": self.episode_id, "segment": i, "segments": len(segs)},
                error=error,
            )
            t.validate()
            out.append(t)
        return out
