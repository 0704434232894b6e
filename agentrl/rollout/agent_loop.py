"""The AgentLoop: one episode as an async state machine, recorded token for token.

States: PENDING (env.reset, render the prompt) → GENERATING (one LLM call) →
PROCESSING_TOOLS (run the parsed tool calls) → env.step → GENERATING … → TERMINATED.

Whatever goes wrong inside an episode — the env raises, the server fails, a
budget runs out — ends that episode with a :class:`StopReason` and the reason
in its record; ``run`` never raises for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from agentrl.chat.consistency import PY_TOOL
from agentrl.chat.templates import STRATEGIES, TemplateReport, inspect_template
from agentrl.chat.tokenization import ChatTokenizer, TemplateError
from agentrl.env import Env, call_maybe_async
from agentrl.inference.protocol import LLMClient, LLMError, SamplingParams
from agentrl.rollout.episode import Episode, EpisodeEnd, EpisodeState, as_messages, scrub
from agentrl.rollout.roles import turn_role
from agentrl.rollout.stages import Stage, StagePlans, generate_turn
from agentrl.tools import ToolExecutor, make_turn_parser
from agentrl.types import Action, StepResult, StopReason, Trajectory, TurnSpan

__all__ = ["AgentLoop", "EpisodeState", "LoopConfig"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopConfig:
    """Budgets and settings of one episode.

    Attributes:
        max_turns: Most model turns.
        max_total_tokens: Context budget: prompt + all turns; each turn's
            generation budget shrinks as the context grows.
        max_tokens_per_turn: Most tokens one model turn may generate.
        episode_timeout_s: Wall-clock budget of the whole episode.
        sampling: Sampling parameters (``max_tokens`` is set per turn).
        tool_parser: Tool-call parser: agentrl's ``hermes``, any vLLM tool parser
            name, or ``auto`` (``agentrl.tools.make_tool_parser``).
        reasoning_parser: Reasoning parser: None, any vLLM reasoning parser
            name, or ``auto`` (``agentrl.tools.make_reasoning_parser``).
        max_parallel_tools: Tool calls of one turn that run at once.
        max_tool_calls_per_turn: Calls beyond this get an explicit error message.
        tool_timeout_s: Timeout of one tool call.
        max_tool_output_chars: Tool output beyond this is cut, with a marker.
        check_template: Inspect the chat template once at start-up (``agentrl doctor
            tokenizer``): choose the strategy and the tools fallback, and refuse a
            template where no strategy holds. Off: ``as_sampled`` unless
            ``template_strategy`` names one, no tools fallback unless asked.
        template_strategy: "auto" (the doctor's choice: ``as_sampled`` for a
            consistent template, ``per_turn`` for one that rewrites history),
            "as_sampled" (one sequence, exactly as sampled) or "per_turn" (each
            model turn its own sample, prompted as inference would).
        inject_tools: Tool schemas into the system message and calls into the
            assistant text (Hermes format) for templates that drop them; None:
            when the start-up check finds the template drops them.
        stages: Generate each model turn as these stages (``agentrl.rollout.stages``);
            empty: one request per turn. An env's own ``stages`` attribute wins.
        role_adapters: Each turn's request asks for the adapter of the env's role for
            it (``adapter_role``; ``trainer.lora.per_role``). Off: no request names one
            (the one policy plays every role); the roles are recorded either way.
    """

    max_turns: int = 8
    max_total_tokens: int = 4096
    max_tokens_per_turn: int = 1024
    episode_timeout_s: float = 600.0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tool_parser: str = "hermes"
    reasoning_parser: str | None = None
    max_parallel_tools: int = 4
    max_tool_calls_per_turn: int = 8
    tool_timeout_s: float = 30.0
    max_tool_output_chars: int = 4096
    check_template: bool = True
    template_strategy: str = "auto"
    inject_tools: bool | None = None
    stages: tuple[Stage, ...] = ()
    role_adapters: bool = False


class AgentLoop:
    """Runs episodes of any Env against an LLMClient and records exact trajectories.

    Args:
        llm: Token-in/token-out client.
        tokenizer: The policy's Hugging Face tokenizer (with a chat template).
        config: Budgets and settings.
    """

    def __init__(self, llm: LLMClient, tokenizer: Any, config: LoopConfig | None = None) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.config = config or LoopConfig()
        cfg = self.config
        if cfg.template_strategy not in ("auto", *STRATEGIES):
            raise ValueError(
                f"template_strategy must be 'auto', {' or '.join(map(repr, STRATEGIES))}, "
                f"got {cfg.template_strategy!r}"
            )
        ChatTokenizer(tokenizer, tools=[PY_TOOL])  # fail fast on a tokenizer without a template
        self.template_report: TemplateReport | None = None
        self._chats: dict[str, ChatTokenizer] = {}
        self.strategy = "as_sampled" if cfg.template_strategy == "auto" else cfg.template_strategy
        self.inject_tools = bool(cfg.inject_tools)
        if cfg.check_template:
            report = inspect_template(tokenizer, inject_tools=cfg.inject_tools)
            self.template_report, self.inject_tools = report, report.inject_tools
            c = report.consistency
            holds = {"as_sampled": c.as_sampled_ok, "per_turn": c.per_turn_ok and c.checked}
            chosen = report.strategy if cfg.template_strategy == "auto" else cfg.template_strategy
            if chosen is None or not holds[chosen]:
                raise TemplateError(
                    "the chat template cannot be trained on exactly: "
                    + (
                        f"{chosen} does not hold"
                        if chosen
                        else "neither as_sampled nor per_turn holds"
                    )
                    + ":\n"
                    + report.summary()
                )
            self.strategy = chosen
            caps = report.capabilities
            if caps is not None and caps.drops_tools:
                _log.warning(
                    "%s; %s",
                    caps.line(),
                    "injecting tool schemas and calls in the Hermes format (inject_tools)"
                    if self.inject_tools
                    else "tools are NOT shown to the model (inject_tools=False)",
                )
        # Injected tools are written in the Hermes format, so 'auto' reads them with it.
        tool_parser = cfg.tool_parser
        if self.inject_tools and tool_parser == "auto":
            tool_parser = "hermes"
        self.parser = make_turn_parser(tool_parser, cfg.reasoning_parser, tokenizer)
        self.plans = StagePlans(tokenizer)
        self.plans.get(cfg.stages)  # a stop that is not one token fails here, not per episode

    async def run(
        self,
        env: Env,
        task: Mapping[str, Any],
        *,
        task_id: str = "0",
        group_id: str = "0",
        episode_id: str = "0",
        seed: int | None = None,
    ) -> Trajectory:
        """Runs one episode to the end and returns its trajectory (never raises for it)."""
        traj = Trajectory(task_id=task_id, group_id=group_id, episode_id=episode_id)
        ep = Episode(traj, env, session_id=episode_id)
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(self.config.episode_timeout_s):
                await self.start_episode(ep, task, seed)
                while True:
                    await self.play_turn(ep)
        except BaseException as e:
            await self.end_episode(ep, e, t0)
        return traj

    async def end_episode(self, ep: Episode, exc: BaseException, t0: float) -> None:
        """Records why ``ep`` ended (``exc``: what ended it), closes its env, totals the reward.

        Re-raises a cancellation (after closing the env); anything else is recorded.
        """
        traj = ep.traj
        if isinstance(exc, EpisodeEnd):
            traj.stop_reason, traj.error = exc.reason, exc.error
        elif isinstance(exc, TimeoutError):
            traj.stop_reason = StopReason.TIMEOUT
            traj.error = f"episode exceeded {self.config.episode_timeout_s}s"
        elif isinstance(exc, asyncio.CancelledError):
            traj.stop_reason = StopReason.ABORTED
            await self._close(ep.env, traj)
            raise exc
        elif isinstance(exc, Exception):
            traj.stop_reason = StopReason.INTERNAL_ERROR
            traj.error = "".join(traceback.format_exception(exc))
        else:
            raise exc
        traj.info["state"] = str(EpisodeState.TERMINATED)
        await self._close(ep.env, traj)
        traj.metrics["episode_time_s"] = time.perf_counter() - t0
        traj.reward = sum(s.reward for s in traj.spans)

    async def _close(self, env: Env, traj: Trajectory) -> None:
        try:
            await call_maybe_async(env.close)
        except Exception:
            traj.metrics["env_close_errors"] = 1.0
            traj.info["close_error"] = traceback.format_exc()

    def _append(self, traj: Trajectory, ids: Sequence[int], kind: str) -> None:
        start = len(traj.token_ids)
        traj.token_ids.extend(ids)
        traj.loss_mask.extend([0] * len(ids))
        traj.rollout_logprobs.extend([0.0] * len(ids))
        traj.weight_versions.extend([-1] * len(ids))
        traj.spans.append(TurnSpan(start, len(traj.token_ids), kind))

    async def _env_call(self, traj: Trajectory, fn: Any, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return await call_maybe_async(fn, *args, **kwargs)
        except (asyncio.CancelledError, TimeoutError):
            raise
        except Exception as e:
            raise EpisodeEnd(StopReason.ENV_ERROR, traceback.format_exc()) from e
        finally:
            self._add(traj.metrics, "env_time_s", time.perf_counter() - t)

    @staticmethod
    def _add(metrics: dict[str, float], key: str, value: float) -> None:
        metrics[key] = metrics.get(key, 0.0) + value

    def bind_tools(self, ep: Episode, tools: Sequence[Any] | None = None) -> None:
        """Sets ``ep``'s parser and tool executor for ``tools`` (None: its env's tools, e.g.
        after a fork, whose env's tools act on its own state, such as its own sandbox)."""
        cfg = self.config
        if tools is None:
            try:
                tools = list(ep.env.tools())
            except TypeError as e:
                raise EpisodeEnd(StopReason.ENV_ERROR, str(e)) from e
        ep.parser = self.parser.with_tools([t.schema() for t in tools])
        ep.executor = ToolExecutor(
            tools,
            max_parallel=cfg.max_parallel_tools,
            max_calls_per_turn=cfg.max_tool_calls_per_turn,
            timeout_s=cfg.tool_timeout_s,
            max_output_chars=cfg.max_tool_output_chars,
        )

    async def start_episode(self, ep: Episode, task: Mapping[str, Any], seed: int | None) -> None:
        """PENDING: resets the env and records the prompt; raises :class:`EpisodeEnd` to end."""
        cfg, traj, env = self.config, ep.traj, ep.env
        traj.info["state"] = str(EpisodeState.PENDING)
        obs = await self._env_call(traj, env.reset, task, seed=seed)
        try:
            messages = scrub(traj, as_messages(obs, "env.reset"))
            tools = list(env.tools())
        except TypeError as e:
            raise EpisodeEnd(StopReason.ENV_ERROR, str(e)) from e
        schemas = [t.schema() for t in tools]
        key = json.dumps(schemas, sort_keys=True, default=str)
        chat = self._chats.get(key)
        if chat is None:
            # Probing a template costs a few renders: once per tool set, not per episode.
            try:
                chat = ChatTokenizer(self.tokenizer, tools=schemas, inject_tools=self.inject_tools)
            except TemplateError as e:
                raise EpisodeEnd(StopReason.TOKENIZATION_ERROR, str(e)) from e
            if len(self._chats) < 64:
                self._chats[key] = chat
        traj.strategy = self.strategy
        traj.info["template_strategy"] = self.strategy
        ep.chat, ep.per_turn = chat, self.strategy == "per_turn"
        sampling = cfg.sampling
        extra_stops = tuple(i for i in chat.eot_ids if i not in sampling.stop_token_ids)
        if extra_stops and extra_stops != (self.tokenizer.eos_token_id,):
            # Families that end a turn on more than eos (gpt-oss's <|call|>, ...).
            sampling = replace(sampling, stop_token_ids=(*sampling.stop_token_ids, *extra_stops))
        ep.sampling = sampling
        self.bind_tools(ep, tools)
        traj.messages.extend(messages)
        t = time.perf_counter()
        try:
            prompt = chat.prompt_ids(messages)
        except TemplateError as e:
            raise EpisodeEnd(StopReason.TOKENIZATION_ERROR, str(e)) from e
        self._add(traj.metrics, "tokenize_time_s", time.perf_counter() - t)
        self._append(traj, prompt, "prompt")
        traj.prompt_length = len(prompt)
        ep.max_turns = min(cfg.max_turns, getattr(env, "max_turns", cfg.max_turns))
        try:
            ep.plan = self.plans.get(env.stages or cfg.stages)
        except (TypeError, ValueError) as e:
            raise EpisodeEnd(StopReason.ENV_ERROR, f"env stages: {e}") from e

    async def play_turn(self, ep: Episode) -> None:
        """One model turn: GENERATING → PROCESSING_TOOLS → env.step → the next context.

        Returns with ``ep`` ready for the next turn; raises :class:`EpisodeEnd` when the
        episode ends (done, truncated, a budget, an error).
        """
        cfg, traj, env, chat, plan = self.config, ep.traj, ep.env, ep.chat, ep.plan
        assert chat is not None and ep.executor is not None, "start_episode first"
        turn, max_turns, per_turn = ep.turn, ep.max_turns, ep.per_turn
        if turn >= max_turns:
            raise EpisodeEnd(StopReason.MAX_TURNS)
        context = traj.token_ids[ep.sample_start :] if per_turn else traj.token_ids
        budget = min(cfg.max_tokens_per_turn, cfg.max_total_tokens - len(context))
        if budget <= 0:
            raise EpisodeEnd(StopReason.MAX_TOKENS)
        try:
            role = turn_role(env)
        except Exception as e:
            raise EpisodeEnd(StopReason.ENV_ERROR, f"env.role: {e}") from e
        traj.info["state"] = str(EpisodeState.GENERATING)
        t = time.perf_counter()
        try:
            gen = await generate_turn(
                self.llm, context, ep.sampling, budget, plan, chat.eot_ids,
                session_id=ep.session_id, adapter_role=role if cfg.role_adapters else None,
            )  # fmt: skip
        except (LLMError, ValueError) as e:
            raise EpisodeEnd(StopReason.LLM_ERROR, str(e)) from e
        self._add(traj.metrics, "generate_time_s", time.perf_counter() - t)
        start = len(traj.token_ids)
        for piece in gen.pieces:  # each stage's tokens with their own logprobs and versions
            n = len(piece.token_ids)
            traj.token_ids.extend(piece.token_ids)
            traj.loss_mask.extend([int(piece.trainable)] * n)
            traj.rollout_logprobs.extend(piece.logprobs)
            traj.weight_versions.extend(piece.weight_versions)
            if plan is not None and piece.trainable:
                name = plan.stages[piece.stage].name or str(piece.stage)
                self._add(traj.metrics, f"stage_tokens/{name}", float(n))
        span = TurnSpan(start, len(traj.token_ids), "model", role=role)
        traj.spans.append(span)
        traj.num_turns = ep.turn = turn + 1

        sampled = gen.token_ids
        text = chat.content_of(sampled)
        parsed = ep.parser.parse(text)
        action = Action(
            text=text,
            content=parsed.content,
            tool_calls=parsed.tool_calls,
            finish_reason=gen.finish_reason,
            parse_errors=parsed.errors,
            reasoning=parsed.reasoning,
            last_turn=turn == max_turns - 1,
        )
        traj.messages.append(action.to_message())
        cut = gen.cut
        if cut:
            # Cut by the token budget (or aborted): the turn is incomplete, so its tool
            # calls are not run; the env still sees it, as the last turn, so an env
            # that scores at the end (e.g. runs tests) can do so. Then the episode ends.
            action = replace(action, tool_calls=(), parse_errors=(), last_turn=True)
        elif sampled[-1] not in chat.eot_ids:
            # Stopped on another stop token: close the turn as the template would,
            # with tokens the model did not sample (masked out).
            self._append(traj, [chat.eot_id], "observation")

        if action.tool_calls or action.parse_errors:
            traj.info["state"] = str(EpisodeState.PROCESSING_TOOLS)
            t = time.perf_counter()
            result = await ep.executor.run(action.tool_calls, action.parse_errors)
            self._add(traj.metrics, "tool_time_s", time.perf_counter() - t)
            traj.tool_calls.extend({"turn": turn, **asdict(r)} for r in result.calls)
            for k, v in result.metrics.items():
                self._add(traj.metrics, k, v)
            action = replace(action, tool_results=tuple(result.messages))

        step = await self._env_call(traj, env.step, action)
        if not isinstance(step, StepResult):
            raise EpisodeEnd(
                StopReason.ENV_ERROR,
                f"env.step must return agentrl.StepResult, got {type(step).__name__}",
            )
        span.reward = float(step.reward)
        for k, v in step.metrics.items():
            self._add(traj.metrics, k, float(v))
        traj.info.update(step.info)
        if cut:
            raise EpisodeEnd(StopReason.MAX_TOKENS)
        observed = scrub(traj, as_messages(list(step.observation), "env.step"))
        new = [*action.tool_results, *observed]
        traj.messages.extend(new)
        if step.terminated:
            raise EpisodeEnd(StopReason.DONE)
        if step.truncated:
            raise EpisodeEnd(StopReason.TRUNCATED)
        if per_turn and turn == max_turns - 1:
            raise EpisodeEnd(StopReason.MAX_TURNS)  # no next sample: a prompt without a model turn
        t = time.perf_counter()
        try:
            if per_turn:
                # The next turn is its own sample, prompted exactly as inference would be.
                delta = chat.prompt_ids(traj.messages)
            else:
                delta = chat.delta_ids(new, after=traj.messages[len(traj.messages) - len(new) - 1])
        except TemplateError as e:
            raise EpisodeEnd(StopReason.TOKENIZATION_ERROR, str(e)) from e
        self._add(traj.metrics, "tokenize_time_s", time.perf_counter() - t)
        if per_turn:
            if len(delta) >= cfg.max_total_tokens:
                raise EpisodeEnd(StopReason.MAX_TOKENS)  # the next sample's prompt alone is over
            ep.sample_start = len(traj.token_ids)
            traj.sample_starts = traj.sample_starts or [0]
            traj.sample_starts.append(ep.sample_start)
            self._append(traj, delta, "prompt")
        else:
            self._append(traj, delta, "observation")
        if len(traj.token_ids) - (ep.sample_start if per_turn else 0) >= cfg.max_total_tokens:
            raise EpisodeEnd(StopReason.MAX_TOKENS)
