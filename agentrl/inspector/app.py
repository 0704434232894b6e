"""The inspector's web app: the page, its static files and the JSON API behind it.

API (every list is paged with ``offset`` and ``limit``):

- ``GET /api/run``: the run's path, steps, tokenizer, config text, stop reasons.
- ``GET /api/steps``: steps with trajectories, their episode count and mean reward.
- ``GET /api/episodes?step=&min_reward=&max_reward=&stop=&task=``: episode summaries
  (``stop`` takes a comma-separated list; ``task`` matches a substring of the task id).
- ``GET /api/episode/{id}``: one episode (``id`` is ``STEP-INDEX``, as the listing gives):
  tokens with loss mask, rollout logprob and weight version, turns and their rewards,
  sample boundaries, messages, tool calls with their outputs, metrics.
- ``GET /api/tree/{id}``: the tree of a tree-rollout leaf's group: nodes (turns, value,
  advantage), leaves (outcome, stop reason, each turn's advantage), as the trainer gave
  them (:mod:`agentrl.inspector.tree`); ``error`` names what is wrong with bad tree data.
- ``GET /api/metrics?keys=``: step series of the dashboard's metrics (or of ``keys``),
  the run's red flags and every numeric key there is.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from agentrl.inspector.data import (
    EpisodeFilter,
    RunData,
    dashboard_keys,
    metric_series,
    numeric_keys,
)
from agentrl.inspector.tokens import TokenDecoder
from agentrl.inspector.tree import (
    NotATreeLeafError,
    TreeError,
    group_tree,
    is_tree_leaf,
    shaped_outcomes,
    tree_settings,
)
from agentrl.reporting.dashboard import RULES, Flag, finite_number
from agentrl.reporting.doctor import diagnose
from agentrl.types import Message, StopReason, Trajectory

__all__ = [
    "STATIC_DIR",
    "TRAINER_LOGPROBS_NOTE",
    "create_app",
    "episode_detail",
    "episode_tree",
]

STATIC_DIR = Path(__file__).parent / "static"
_RULE_KEYS = {r.name: r.keys for r in RULES}

TRAINER_LOGPROBS_NOTE = (
    "the run directory stores the rollout (sampler) logprobs only; the trainer's per-token "
    "logprobs are not saved, so their step-level agreement is in the chart "
    "(offpolicy/rho_mean, correction/*, actor/ratio_mean)"
)


def _round(v: float) -> float | None:
    return round(v, 5) if math.isfinite(v) else None


def _tool_calls(
    messages: list[Message], records: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Each tool call of the episode with its turn and output (paired by call id, else order).

    ``records`` (``Trajectory.tool_calls``: one per tool message, in order, with its
    turn) add each call's ``latency_s`` and ``error``; None where not recorded.
    """
    by_turn: dict[int, list[dict[str, Any]]] = {}
    for rec in records or []:
        by_turn.setdefault(int(rec.get("turn", -1)), []).append(rec)

    def timing(turn: int, results: list[Message], msg: Message | None) -> dict[str, Any]:
        recs = by_turn.get(turn, [])
        k = next((i for i, r in enumerate(results) if r is msg), -1)
        rec = recs[k] if 0 <= k < len(recs) else {}
        return {"latency_s": finite_number(rec.get("latency_s")), "error": rec.get("error")}

    out: list[dict[str, Any]] = []
    turn = -1
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.role != "assistant":
            i += 1
            continue
        turn += 1
        j = i + 1
        results = []
        while j < len(messages) and messages[j].role == "tool":
            results.append(messages[j])
            j += 1
        unused = list(results)
        for c in m.tool_calls:
            match = next((r for r in unused if c.id and r.tool_call_id == c.id), None)
            if match is None:
                match = next((r for r in unused if not r.tool_call_id or not c.id), None)
            if match is not None:
                unused.remove(match)
            out.append(
                {
                    "turn": turn,
                    "id": c.id,
                    "name": c.name,
                    "arguments": c.arguments,
                    "output": None if match is None else match.content,
                    **timing(turn, results, match),
                }
            )
        for r in unused:
            out.append(
                {"turn": turn, "id": r.tool_call_id, "name": r.name, "arguments": None,
                 "output": r.content, **timing(turn, results, r)}
            )  # fmt: skip
        i = j
    return out


def episode_detail(
    t: Trajectory, step: int, index: int, decoder: TokenDecoder | None
) -> dict[str, Any]:
    """Everything the page shows of one episode, JSON-ready."""
    model_turn = 0
    spans = []
    for s in t.spans:
        turn = None
        if s.kind == "model":
            turn, model_turn = model_turn, model_turn + 1
        spans.append(
            {
                "start": s.start, "end": s.end, "kind": s.kind, "reward": s.reward,
                "turn": turn, "role": s.role,
            }
        )  # fmt: skip
    return {
        "id": f"{step}-{index}",
        "step": step,
        "index": index,
        "episode_id": t.episode_id,
        "task_id": t.task_id,
        "group_id": t.group_id,
        "reward": t.reward,
        "stop_reason": str(t.stop_reason),
        "num_turns": t.num_turns,
        "num_tokens": len(t.token_ids),
        "num_model_tokens": t.num_model_tokens,
        "prompt_length": t.prompt_length,
        "strategy": t.strategy,
        "samples": [list(s) for s in t.samples()],
        "tokens": {
            "ids": t.token_ids,
            "text": decoder.decode(t.token_ids) if decoder is not None else None,
            "loss_mask": t.loss_mask,
            "rollout_logprobs": [_round(v) for v in t.rollout_logprobs],
            "weight_versions": t.weight_versions,
        },
        "trainer_logprobs": None,
        "trainer_logprobs_note": TRAINER_LOGPROBS_NOTE,
        "spans": spans,
        "turn_rewards": [
            {"turn": s["turn"], "reward": s["reward"], "end": s["end"]}
            for s in spans
            if s["kind"] == "model"
        ],
        "messages": [m.to_dict() for m in t.messages],
        "tool_calls": _tool_calls(t.messages, t.tool_calls),
        "tool_time_s": finite_number(t.metrics.get("tool_time_s")),
        "metrics": {k: finite_number(v) for k, v in t.metrics.items()},
        "info": t.info,
        "tree": is_tree_leaf(t),
        "error": t.error,
    }


def episode_tree(
    run: RunData, step: int, index: int, decoder: TokenDecoder | None
) -> dict[str, Any]:
    """The tree of the group of episode ``index`` of ``step``, JSON-ready (``group_tree``
    plus ``step``, each leaf's ``id``, where the outcomes came from, notes, ``error``).

    Raises:
        KeyError: No such step or episode.
        NotATreeLeafError: The episode is not a leaf of a tree rollout.
    """
    batch, start, discarded = run.file_of(step, index)
    t = batch[index - start]
    if not is_tree_leaf(t):
        raise NotATreeLeafError(
            f"episode {step}-{index} is not a leaf of a tree rollout (no info['tree']['node_ids'])"
        )
    members = [k for k, u in enumerate(batch) if u.group_id == t.group_id]
    config = run.config_text()
    settings = tree_settings(config)
    notes = [f"settings: {settings.source}"]
    if settings.estimator != "tree_grpo":
        notes.append(
            f"the run's estimator is {settings.estimator!r}: shown is what tree_grpo gives"
        )
    if settings.whiten:
        notes.append("trainer.advantage.whiten is on: the trainer then whitened over the batch")
    outcomes: list[float] = [float(batch[k].reward) for k in members]
    if discarded:
        how = "the episodes' rewards (discarded episodes: not trained)"
    else:
        scores, how = shaped_outcomes(batch, config)
        if any(scores[k] is None for k in members):
            notes.append("trainer.shaping.dynamic_filter dropped this group: it was not trained")
        else:
            outcomes = [float(scores[k] or 0.0) for k in members]
    leaves = [batch[k] for k in members]
    decode = decoder.decode if decoder is not None else None
    try:
        view = group_tree(leaves, outcomes=outcomes, settings=settings, decode=decode)
        error = None
    except TreeError as e:
        view, error = {"group_id": t.group_id, "nodes": [], "leaves": []}, str(e)
    for k, leaf in zip(members, view["leaves"], strict=False):
        leaf["id"] = f"{step}-{start + k}"
    return {**view, "step": step, "outcomes_from": how, "notes": notes, "error": error}


def _flag(f: Flag) -> dict[str, Any]:
    return {
        "name": f.name,
        "step": f.step,
        "failure_mode": f.failure_mode,
        "detail": f.detail,
        "keys": list(_RULE_KEYS.get(f.name, ())),
    }


def _parse_id(eid: str) -> tuple[int, int]:
    try:
        step, index = eid.split("-", 1)
        return int(step), int(index)
    except ValueError:
        raise HTTPException(400, f"episode id {eid!r} is not STEP-INDEX (e.g. 3-0)") from None


def create_app(
    run: RunData, decoder: TokenDecoder | None = None, tokenizer_note: str = ""
) -> FastAPI:
    """The inspector for one run.

    Args:
        run: The run directory's data.
        decoder: Turns token ids into text (None: the page shows ids).
        tokenizer_note: Where the tokenizer came from, or why there is none.
    """
    app = FastAPI(title=f"agentrl inspector: {run.path.name}", docs_url=None, redoc_url=None)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return (STATIC_DIR / "index.html").read_text()

    @app.get("/api/run")
    def run_info() -> dict[str, Any]:
        return {
            "path": str(run.path.resolve()),
            "name": run.path.resolve().name,
            "steps": len(run.steps()),
            "tokenizer": tokenizer_note,
            "has_tokenizer": decoder is not None,
            "stop_reasons": [str(s) for s in StopReason],
            "trainer_logprobs_note": TRAINER_LOGPROBS_NOTE,
            "config": run.config_text(),
        }

    @app.get("/api/steps")
    def steps(
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
    ) -> dict[str, Any]:
        all_steps = run.steps()
        reward: dict[int, float | None] = {}
        for r in run.metric_rows():
            if r.get("kind", "train") == "train" and "step" in r:
                reward[r["step"]] = finite_number(r.get("reward/mean", r.get("reward_mean")))
        page = all_steps[offset : offset + limit]
        return {
            "total": len(all_steps),
            "offset": offset,
            "limit": limit,
            "steps": [
                {"step": s, "episodes": run.num_episodes(s), "reward_mean": reward.get(s)}
                for s in page
            ],
        }

    @app.get("/api/episodes")
    def episodes(
        step: int | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        stop: str = "",
        task: str = "",
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
    ) -> dict[str, Any]:
        stops = tuple(s.strip() for s in stop.split(",") if s.strip())
        flt = EpisodeFilter(step, min_reward, max_reward, stops, task.strip())
        try:
            total, page = run.episodes(flt, offset, limit)
        except KeyError:
            raise HTTPException(404, f"no trajectories for step {step}") from None
        return {"total": total, "offset": offset, "limit": limit, "episodes": page}

    @app.get("/api/episode/{eid}")
    def episode(eid: str) -> dict[str, Any]:
        step, index = _parse_id(eid)
        try:
            t = run.trajectory(step, index)
        except KeyError:
            raise HTTPException(404, f"no episode {eid} (step {step}, index {index})") from None
        return episode_detail(t, step, index, decoder)

    @app.get("/api/tree/{eid}")
    def tree(eid: str) -> dict[str, Any]:
        step, index = _parse_id(eid)
        try:
            return episode_tree(run, step, index, decoder)
        except NotATreeLeafError as e:
            raise HTTPException(404, str(e)) from None
        except KeyError:
            raise HTTPException(404, f"no episode {eid} (step {step}, index {index})") from None

    @app.get("/api/metrics")
    def metrics(keys: str = "") -> dict[str, Any]:
        rows = run.metric_rows()
        present = numeric_keys(rows)
        dash = [k for k in dashboard_keys() if k in present]
        wanted = [k.strip() for k in keys.split(",") if k.strip()] or dash
        flags = diagnose(rows) if rows else []
        return {
            "keys": present,
            "dashboard": dash,
            "series": metric_series(rows, wanted),
            "flags": [_flag(f) for f in flags],
        }

    return app
