"""The inspector's tree API over HTTP, on a run dir of tree leaves written by the real writer."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agentrl.inspector import RunData, create_app, find_decoder
from agentrl.inspector.app import STATIC_DIR
from tests.helpers.tree_runs import TREE_CONFIG, write_tree_run

S = 0.5 + 1e-6  # the 2x2 group's std + eps (norm_by_std: true in the run's config)


@pytest.fixture(scope="module")
def run_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tree-run")
    write_tree_run(path)
    return path


@pytest.fixture(scope="module")
def client(run_path) -> TestClient:
    dec, note = find_decoder(run_path)
    return TestClient(create_app(RunData(run_path), dec, note))


def test_episode_says_it_is_a_tree_leaf(client):
    ep = client.get("/api/episode/1-1").json()
    assert ep["tree"] is True and ep["info"]["tree"]["node_ids"] == ["0", "0.0", "0.0.1"]
    assert client.get("/api/episode/1-6").json()["tree"] is False


def test_tree_of_a_leafs_group(client):
    r = client.get("/api/tree/1-2")
    assert r.status_code == 200, r.text
    tree = r.json()
    assert tree["error"] is None and tree["group_id"] == "g1" and tree["step"] == 1
    assert tree["settings"]["norm_by_std"] is True and "config.yaml" in tree["settings"]["source"]
    assert "shaped" in tree["outcomes_from"]
    nodes = {n["id"]: n for n in tree["nodes"]}
    assert list(nodes) == ["0", "0.0", "0.0.0", "0.0.1", "0.1", "0.1.0", "0.1.1"]
    assert nodes["0.0"]["value"] == 0.5 and nodes["0.0"]["advantage"] == pytest.approx(0.25 / S)
    assert nodes["0.1"]["turns"] == [{"turn": 1, "text": " step 0.1", "after": " seen 0.1"}]
    leaves = tree["leaves"]
    assert [x["id"] for x in leaves] == ["1-0", "1-1", "1-2", "1-3"]
    assert [(x["outcome"], x["stop_reason"]) for x in leaves] == [
        (1.0, "done"),
        (0.0, "done"),
        (0.0, "max_tokens"),
        (0.0, "done"),
    ]
    assert leaves[0]["turn_advantages"] == pytest.approx([0.0, 0.25 / S, 0.5 / S])
    # Every leaf of the group answers with the same tree.
    assert client.get("/api/tree/1-0").json()["nodes"] == tree["nodes"]


def test_shaping_from_the_run_config(tmp_path):
    write_tree_run(tmp_path)
    (tmp_path / "config.yaml").write_text(TREE_CONFIG + "    reward_clip: 0.5\n")
    tree = TestClient(create_app(RunData(tmp_path))).get("/api/tree/1-0").json()
    # Outcomes clipped to 0.5, 0, 0, 0: mean 0.125, std 0.25.
    assert [x["outcome"] for x in tree["leaves"]] == [0.5, 0.0, 0.0, 0.0]
    nodes = {n["id"]: n for n in tree["nodes"]}
    assert nodes["0.0"]["advantage"] == pytest.approx(0.125 / (0.25 + 1e-6))
    assert nodes["0"]["turns"][0]["text"] == "step 0"  # no tokenizer: the assistant message


def test_bad_tree_data_and_bad_requests(client):
    r = client.get("/api/tree/1-5")
    assert r.status_code == 200
    bad = r.json()
    assert bad["group_id"] == "g2" and bad["nodes"] == [] and bad["leaves"] == []
    assert "node 'x' has two parents: 'a' (episode g2/0) and 'b' (episode g2/1)" in bad["error"]
    r = client.get("/api/tree/1-6")
    assert r.status_code == 404 and "not a leaf of a tree rollout" in r.json()["detail"]
    r = client.get("/api/tree/1-99")
    assert r.status_code == 404 and "no episode 1-99" in r.json()["detail"]
    assert client.get("/api/tree/x").status_code == 400


def test_page_has_the_tree_view(client):
    js = client.get("/static/app.js").text
    assert "/api/tree/" in js and (STATIC_DIR / "app.js").read_text() == js
