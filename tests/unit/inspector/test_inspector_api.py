"""The inspector's JSON API and page, over HTTP, on a run dir written by the real writer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agentrl.inspector import NotARunDirError, RunData, create_app, find_decoder
from agentrl.inspector.app import STATIC_DIR
from agentrl.inspector.tokens import TokenDecoder
from agentrl.models.tokenizer import build_tokenizer
from agentrl.reporting.run_dir import RunDir
from tests.helpers.run_dirs import tool_episode, write_run


@pytest.fixture(scope="module")
def run_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("run")
    write_run(path)
    return path


@pytest.fixture(scope="module")
def decoder(run_path) -> TokenDecoder:
    dec, note = find_decoder(run_path)
    assert dec is not None and note == "tiny model (seed 0)"
    return dec


@pytest.fixture(scope="module")
def client(run_path, decoder) -> TestClient:
    return TestClient(create_app(RunData(run_path), decoder, "tiny model (seed 0)"))


def test_not_a_run_dir_is_a_clear_error(tmp_path):
    with pytest.raises(NotARunDirError, match="does not exist"):
        RunData(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotARunDirError, match="is not a directory"):
        RunData(tmp_path / "file")
    with pytest.raises(NotARunDirError, match="is not a run directory"):
        RunData(tmp_path)
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]  # nothing created


def test_run_and_steps(client, run_path):
    run = client.get("/api/run").json()
    assert run["path"] == str(run_path.resolve()) and run["steps"] == 3
    assert run["has_tokenizer"] and "max_tokens" in run["stop_reasons"]
    assert "not saved" in run["trainer_logprobs_note"]
    steps = client.get("/api/steps").json()
    assert steps["total"] == 3
    assert [(s["step"], s["episodes"], s["reward_mean"]) for s in steps["steps"]] == [
        (1, 4, 0.0),
        (2, 4, 0.0),
        (3, 4, 0.0),
    ]
    page = client.get("/api/steps", params={"offset": 1, "limit": 1}).json()
    assert page["total"] == 3 and [s["step"] for s in page["steps"]] == [2]


def _ids(resp) -> list[str]:
    return [e["id"] for e in resp.json()["episodes"]]


def test_episode_filters(client):
    def get(**params):
        r = client.get("/api/episodes", params=params)
        assert r.status_code == 200, r.text
        return r

    one = get(step=2).json()
    assert one["total"] == 4 and _ids(get(step=2)) == ["2-0", "2-1", "2-2", "2-3"]
    e = one["episodes"][0]
    assert (e["episode_id"], e["task_id"], e["reward"], e["stop_reason"]) == (
        "g2/0",
        "math/0",
        1.0,
        "done",
    )
    assert e["num_model_tokens"] < e["num_tokens"] and e["num_turns"] == 2
    assert one["episodes"][3]["error"] is True and one["episodes"][2]["strategy"] == "per_turn"
    assert _ids(get(step=2, min_reward=0.5)) == ["2-0", "2-2"]
    assert _ids(get(step=2, max_reward=0)) == ["2-1", "2-3"]
    assert _ids(get(step=2, min_reward=0, max_reward=0.5)) == ["2-1", "2-2"]
    assert _ids(get(step=2, stop="max_tokens")) == ["2-1"]
    assert _ids(get(step=2, stop="max_tokens,timeout")) == ["2-1", "2-3"]
    assert _ids(get(step=2, task="MATH/1")) == ["2-1", "2-3"]
    assert _ids(get(step=2, task="math/1", stop="timeout")) == ["2-3"]
    assert get(step=2, task="nope").json() == {
        "total": 0,
        "offset": 0,
        "limit": 50,
        "episodes": [],
    }
    # Every step, newest first; the done ones of all steps.
    assert _ids(get(stop="done")) == ["3-0", "3-2", "2-0", "2-2", "1-0", "1-2"]


def test_episode_pages_cover_everything_once(client):
    seen, offset = [], 0
    while True:
        d = client.get("/api/episodes", params={"offset": offset, "limit": 5}).json()
        assert d["total"] == 12 and len(d["episodes"]) <= 5
        if not d["episodes"]:
            break
        seen += [e["id"] for e in d["episodes"]]
        offset += 5
    assert len(seen) == 12 and len(set(seen)) == 12 and seen[0] == "3-0" and seen[-1] == "1-3"


def test_bad_requests_are_clear(client):
    r = client.get("/api/episodes", params={"step": 9})
    assert r.status_code == 404 and r.json()["detail"] == "no trajectories for step 9"
    assert client.get("/api/episodes", params={"limit": 501}).status_code == 422
    assert client.get("/api/episodes", params={"offset": -1}).status_code == 422
    r = client.get("/api/episode/2-7")
    assert r.status_code == 404 and "no episode 2-7" in r.json()["detail"]
    assert client.get("/api/episode/9-0").status_code == 404
    r = client.get("/api/episode/abc")
    assert r.status_code == 400 and "STEP-INDEX" in r.json()["detail"]


def test_episode_detail_tokens_turns_tools(client, run_path, decoder):
    ep = client.get("/api/episode/2-0").json()
    t = RunData(run_path).trajectory(2, 0)
    tokens = ep["tokens"]
    assert tokens["ids"] == t.token_ids and tokens["loss_mask"] == t.loss_mask
    assert tokens["rollout_logprobs"] == pytest.approx(t.rollout_logprobs)
    assert tokens["weight_versions"] == t.weight_versions
    # Per-token text, in order, is the conversation's text.
    assert "".join(tokens["text"]) == build_tokenizer(0).decode(t.token_ids)
    model_text = "".join(x for x, m in zip(tokens["text"], t.loss_mask, strict=True) if m)
    assert model_text == " I will call two tools the answer is 42"
    assert ep["trainer_logprobs"] is None and "not saved" in ep["trainer_logprobs_note"]
    assert [(s["kind"], s["turn"], s["reward"]) for s in ep["spans"]] == [
        ("prompt", None, 0.0),
        ("model", 0, 0.0),
        ("observation", None, 0.0),
        ("model", 1, 1.0),
    ]
    assert [(r["turn"], r["reward"]) for r in ep["turn_rewards"]] == [(0, 0.0), (1, 1.0)]
    assert [(c["turn"], c["name"], c["arguments"], c["output"]) for c in ep["tool_calls"]] == [
        (0, "python", {"code": "6*7"}, "42"),
        (0, "calc", {"x": 7}, "7"),
    ]
    # Per-call latency and failure, paired with the call through its tool message.
    assert [(c["name"], c["latency_s"], c["error"]) for c in ep["tool_calls"]] == [
        ("python", 0.375, "tool_timeouts"),
        ("calc", 0.125, None),
    ]
    unrecorded = client.get("/api/episode/2-1").json()["tool_calls"]  # e.g. an older run
    assert [(c["latency_s"], c["error"]) for c in unrecorded] == [(None, None), (None, None)]
    assert ep["tool_time_s"] == 0.5 and ep["metrics"]["tool_calls"] == 2.0
    assert (ep["stop_reason"], ep["strategy"]) == ("done", "as_sampled")
    assert ep["samples"] == [[0, len(t.token_ids)]] and ep["num_tokens"] == len(t.token_ids)
    assert ep["messages"][1]["tool_calls"][0]["function"]["name"] == "python"


def test_episode_detail_per_turn_samples_and_error(client):
    ep = client.get("/api/episode/1-2").json()
    assert ep["strategy"] == "per_turn"
    b = ep["spans"][2]["start"]
    assert ep["samples"] == [[0, b], [b, ep["num_tokens"]]]
    assert client.get("/api/episode/1-3").json()["error"] == "Traceback: boom"


def test_episode_without_tokenizer_has_ids_only(run_path):
    c = TestClient(create_app(RunData(run_path)))
    ep = c.get("/api/episode/3-1").json()
    assert ep["tokens"]["text"] is None and len(ep["tokens"]["ids"]) == ep["num_tokens"]
    assert c.get("/api/run").json()["has_tokenizer"] is False


def test_metrics_series_and_flags(client):
    d = client.get("/api/metrics").json()
    assert d["dashboard"] == ["reward/mean", "actor/entropy", "success"]
    assert set(d["keys"]) == {"reward/mean", "actor/entropy", "perf/tokens_per_s", "success"}
    assert list(d["series"]) == d["dashboard"]
    assert d["series"]["reward/mean"]["train"] == [[s, 0.0] for s in range(1, 7)]
    assert d["series"]["success"] == {"train": [], "eval": [[3, 0.25]]}
    flag = next(f for f in d["flags"] if f["name"] == "reward_flat_zero")
    assert flag["step"] == 1 and "reward/mean" in flag["keys"]
    d = client.get("/api/metrics", params={"keys": "perf/tokens_per_s"}).json()
    assert list(d["series"]) == ["perf/tokens_per_s"]
    assert d["series"]["perf/tokens_per_s"]["train"][0] == [1, 9.0]


def test_metrics_of_a_run_being_written(tmp_path):
    run = RunDir(tmp_path)
    run.log(1, {"reward/mean": 0.5})
    with run.metrics_file.open("a") as f:
        f.write('{"step": 2, "reward/me')  # torn last line while the run writes
    c = TestClient(create_app(RunData(tmp_path)))
    assert c.get("/api/metrics").json()["series"]["reward/mean"]["train"] == [[1, 0.5]]
    assert c.get("/api/steps").json()["total"] == 0


def test_listing_follows_a_rewritten_step_file(tmp_path):
    tok = build_tokenizer(0)
    run = RunDir(tmp_path)
    run.save_trajectories(1, [tool_episode(tok, 1, 0)])
    c = TestClient(create_app(RunData(tmp_path)))
    assert c.get("/api/episodes", params={"step": 1}).json()["total"] == 1
    run.save_trajectories(1, [tool_episode(tok, 1, k) for k in range(3)])
    assert c.get("/api/episodes", params={"step": 1}).json()["total"] == 3
    assert c.get("/api/episode/1-2").json()["episode_id"] == "g1/2"


def test_page_and_static_files_are_served_and_self_contained(client):
    page = client.get("/")
    assert page.status_code == 200 and 'src="/static/app.js"' in page.text
    for name in ("app.js", "style.css"):
        r = client.get(f"/static/{name}")
        assert r.status_code == 200 and len(r.text) > 500
    # Nothing is fetched from elsewhere (no CDN; there may be no internet at view time).
    for f in STATIC_DIR.iterdir():
        text = f.read_text()
        assert not re.search(r"(src|href)=[\"']?(https?:)?//", text), f.name
        assert "import(" not in text and "@import" not in text, f.name


def test_tokenizer_lookup(tmp_path, run_path):
    from agentrl.inspector import TokenizerNotFoundError

    with pytest.raises(TokenizerNotFoundError, match=r"no tokenizer\.json"):
        find_decoder(run_path, str(tmp_path))
    build_tokenizer(0).save_pretrained(str(tmp_path / "tok"))
    dec, note = find_decoder(run_path, str(tmp_path / "tok"))
    assert dec is not None and note == f"tokenizer from {tmp_path / 'tok'}"
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text("")
    assert find_decoder(tmp_path / "r") == (None, find_decoder(tmp_path / "r")[1])
    assert "tokens shown as ids" in find_decoder(tmp_path / "r")[1]
    (tmp_path / "r" / "config.yaml").write_text(f"model:\n  path: {tmp_path / 'none'}\n")
    dec, note = find_decoder(tmp_path / "r")
    assert dec is None and "no tokenizer.json in the run's model.path" in note
    (tmp_path / "r" / "final_model").mkdir()
    build_tokenizer(0).save_pretrained(str(tmp_path / "r" / "final_model"))
    dec, note = find_decoder(tmp_path / "r")
    assert dec is not None and "final_model" in note


def test_a_run_of_the_named_tiny_model_decodes_with_its_tokenizer(tmp_path):
    (tmp_path / "config.yaml").write_text("model:\n  path: tiny\n  tiny_seed: 0\n")
    dec, note = find_decoder(tmp_path)
    assert dec is not None and note == "tiny model (seed 0)"


def test_a_run_of_a_named_model_looks_in_its_cached_directory(tmp_path, monkeypatch):
    from agentrl.models import registry

    model = tmp_path / "converted"
    write_run(tmp_path / "run")  # its config says model.path null; point it at a name
    (tmp_path / "run" / "config.yaml").write_text("model:\n  path: smollm2-135m\n")
    asked = []

    def cached(name, *, install=True, **_kw):
        asked.append((name, install))
        return model

    monkeypatch.setattr(registry, "get_model", cached)
    dec, note = find_decoder(tmp_path / "run")
    assert asked == [("smollm2-135m", False)]  # never installs to show tokens
    assert dec is None and str(model) in note  # no tokenizer there: said, with the path
