"""Reward model as a reward source: directory checks, the /classify client over real HTTP
(batching, timeouts, a server that is down), and the scorer's rendering, mixing and
failure handling. The real vLLM pooling server is in tests/integration/test_reward_model.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from fastapi import FastAPI, Request

from agentrl import Message, StopReason, Trajectory
from agentrl.config import load_config
from agentrl.inference.reward_model import (
    RewardModelClient,
    RewardModelConfigError,
    RewardModelError,
    check_reward_model_dir,
)
from agentrl.inference.server import free_port
from agentrl.orchestration.driver import select_groups
from agentrl.orchestration.reward_scoring import check_reward_model
from agentrl.orchestration.startup import ComponentError
from agentrl.rewards import RewardMix, ScoredRunner, Scorer, reward_model_metrics


def _write_config(path: Path, **cfg: object) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_reward_model_dir_checks_name_the_problem(tmp_path):
    with pytest.raises(RewardModelConfigError, match="does not exist"):
        check_reward_model_dir(tmp_path / "nope")
    causal = _write_config(tmp_path / "lm", architectures=["Qwen2ForCausalLM"])
    with pytest.raises(RewardModelConfigError, match="is a Qwen2ForCausalLM, not a sequence"):
        check_reward_model_dir(causal)
    two = _write_config(
        tmp_path / "two",
        architectures=["Qwen2ForSequenceClassification"],
        id2label={"0": "a", "1": "b"},
    )
    with pytest.raises(RewardModelConfigError, match="has 2 labels"):
        check_reward_model_dir(two)
    good = _write_config(
        tmp_path / "rm",
        architectures=["Qwen2ForSequenceClassification"],
        num_labels=1,
        max_position_embeddings=256,
    )
    assert check_reward_model_dir(good) == (good, 256)


def test_a_bad_reward_model_path_is_one_clear_error_at_startup(tmp_path):
    cfg = load_config(None, [f"reward.model={tmp_path / 'missing'}"])
    with pytest.raises(ComponentError, match=r"reward\.model .* does not exist"):
        check_reward_model(cfg)
    check_reward_model(load_config(None, []))  # no reward model: nothing to check
    with pytest.raises(ComponentError, match=r"reward\.url needs reward\.model"):
        check_reward_model(load_config(None, ["reward.url=http://127.0.0.1:1"]))


class ClassifyServer:
    """A /classify double over real HTTP: score = sum(ids) / 100, optional delay or error."""

    def __init__(self, delay_s: float = 0.0, status: int = 200) -> None:
        self.bodies: list[dict] = []
        app = FastAPI()

        @app.post("/classify")
        async def classify(request: Request):
            body = await request.json()
            self.bodies.append(body)
            await asyncio.sleep(delay_s)
            if status != 200:
                from fastapi.responses import JSONResponse

                return JSONResponse({"error": "boom"}, status_code=status)
            data = [
                {"index": i, "label": "LABEL_0", "probs": [sum(x) / 100], "num_classes": 1}
                for i, x in enumerate(body["input"])
            ]
            return {"data": data[::-1]}  # out of order: the client sorts by index

        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> ClassifyServer:
        self._thread.start()
        while not self._server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)


async def test_client_batches_in_order_with_raw_scores():
    with ClassifyServer() as srv:
        async with RewardModelClient(srv.url, batch_size=2) as client:
            scores = await client.score([[1], [2, 3], [10], [50, 50], [7]])
    assert scores == [0.01, 0.05, 0.1, 1.0, 0.07]
    assert [len(b["input"]) for b in srv.bodies] == [2, 2, 1]
    assert all(b["use_activation"] is False for b in srv.bodies)  # raw logits, no sigmoid


@pytest.mark.parametrize(
    ("server", "match"),
    [
        (dict(delay_s=2.0), "timed out after 0.3s"),
        (dict(status=500), "answered 500"),
    ],
)
async def test_client_failures_are_reward_model_errors(server, match):
    with ClassifyServer(**server) as srv:
        async with RewardModelClient(srv.url, timeout_s=0.3) as client:
            with pytest.raises(RewardModelError, match=match):
                await client.score([[1, 2]])


async def test_a_server_that_is_down_is_a_reward_model_error():
    async with RewardModelClient(f"http://127.0.0.1:{free_port()}", timeout_s=2) as client:
        with pytest.raises(RewardModelError, match="unreachable"):
            await client.score([[1]])


class FakeRM:
    """Scores a sequence by its length; records what it was sent; can fail."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.sent: list[list[list[int]]] = []
        self.fail = fail

    async def score(self, sequences: Sequence[Sequence[int]]) -> list[float]:
        self.sent.append([list(s) for s in sequences])
        if self.fail:
            raise self.fail
        return [float(len(s)) for s in sequences]


def _traj(i: int, reward: float = 1.0, n: int = 3, **kw) -> Trajectory:
    t = Trajectory(task_id="t", group_id="g", episode_id=f"g/{i}", **kw)
    t.token_ids = list(range(1, n + 1))
    t.loss_mask = [0] + [1] * (n - 1)
    t.rollout_logprobs = [0.0] * n
    t.weight_versions = [-1] + [0] * (n - 1)
    t.messages = [Message.user("hi"), Message.assistant("x" * i)]
    t.reward = reward
    return t


async def test_messages_are_rendered_with_the_reward_models_template_and_mixed(tokenizer):
    rm = FakeRM()
    scorer = Scorer(rm, tokenizer, mix=RewardMix(weight=0.5, env_weight=2.0, clip=4.0))
    group = [_traj(1, reward=1.0), _traj(9, reward=0.0)]
    await scorer.score_group(group)
    expected = [
        tokenizer.encode(
            tokenizer.apply_chat_template([m.to_dict() for m in t.messages], tokenize=False),
            add_special_tokens=False,
        )
        for t in group
    ]
    assert rm.sent == [expected]  # one batch per group
    for t, ids, env in zip(group, expected, [1.0, 0.0], strict=True):
        score = float(len(ids))
        assert t.metrics["rm/score"] == score and t.info["env_reward"] == env
        assert t.reward == pytest.approx(2.0 * env + 0.5 * min(score, 4.0))  # clipped at 4
        assert t.stop_reason == StopReason.DONE
    m = reward_model_metrics(group)
    assert m["reward/rm_mean"] == pytest.approx(sum(map(len, expected)) / 2)
    assert m["reward/rm_scored"] == 2.0 and m["reward/rm_latency_s"] >= 0.0


async def test_tokens_input_scores_the_exact_token_ids_and_replaces_the_env_reward(tokenizer):
    rm = FakeRM()
    t = _traj(1, reward=1.0, n=5)
    await Scorer(rm, tokenizer, input="tokens").score_group([t])
    assert rm.sent == [[[1, 2, 3, 4, 5]]]
    assert t.reward == 5.0  # default mix: the reward model alone


async def test_failed_scoring_ends_the_episodes_scoring_with_a_reason_and_is_not_trained(
    tokenizer,
):
    down = Scorer(FakeRM(fail=RuntimeError("reward model unreachable at X")), tokenizer)
    group = [_traj(1), _traj(2)]
    await down.score_group(group)
    assert {t.stop_reason for t in group} == {StopReason.REWARD_ERROR}
    assert all("unreachable at X" in (t.error or "") for t in group)
    assert group[0].info["stop_reason_before_reward"] == "done"
    assert group[0].reward == 1.0  # untouched
    kept, why = select_groups([group], dynamic_filter=False, min_group=2)
    assert kept == [] and why["episode:reward_error"] == 2  # counted, not trained
    assert reward_model_metrics(group) == {}

    # One episode over the reward model's context fails alone; the other is scored.
    rm = FakeRM()
    long_one, ok = _traj(1, n=50), _traj(2, n=5)
    await Scorer(rm, tokenizer, input="tokens", max_len=10).score_group([long_one, ok])
    assert long_one.stop_reason == StopReason.REWARD_ERROR
    assert "50 tokens, over the reward model's context (10)" in (long_one.error or "")
    assert ok.metrics["rm/score"] == 5.0 and rm.sent == [[[1, 2, 3, 4, 5]]]


async def test_episodes_that_already_failed_are_not_scored(tokenizer):
    rm = FakeRM()
    failed = _traj(1, stop_reason=StopReason.LLM_ERROR)
    await Scorer(rm, tokenizer).score_group([failed])
    assert rm.sent == [] and failed.stop_reason == StopReason.LLM_ERROR


async def test_scored_runner_scores_each_group_it_runs(tokenizer):
    class Inner:
        group_size = 2

        async def run_group(self, task, *, index, seed=0, tag=""):
            return [_traj(1), _traj(2)]

    runner = ScoredRunner(Inner(), Scorer(FakeRM(), tokenizer, input="tokens"))
    assert runner.group_size == 2
    group = await runner.run_group({}, index=0)
    assert [t.reward for t in group] == [3.0, 3.0]
