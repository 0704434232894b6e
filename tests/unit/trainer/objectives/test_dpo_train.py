"""DPO through the Trainer on the real (untrained) tiny model, on CPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from agentrl.models.tiny import TinyRecipe, ensure_tiny_model
from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.objectives.pairs_file import PairsFileError
from tests.helpers.trainer import params, random_batch, tiny_lm

UNTRAINED = TinyRecipe(steps=0, copy_steps=0, num_demos=0, max_position_embeddings=512)
PAIRS = [
    {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"},
    {"prompt": "Capital of France?", "chosen": "Paris", "rejected": "Rome"},
    {"prompt": "Say yes", "chosen": "yes", "rejected": "no thanks"},
    {"prompt": "3*3=", "chosen": [{"role": "assistant", "content": "9"}], "rejected": "6"},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = os.environ.get("AGENTRL_CACHE_DIR") or str(tmp_path_factory.mktemp("cache"))
    return ensure_tiny_model(UNTRAINED, cache_dir=cache)


@pytest.fixture
def pairs_file(tmp_path: Path) -> str:
    p = tmp_path / "pairs.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    return str(p)


def _cfg(pairs: str | None, **dpo: object) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {
            "loss": {"name": "dpo"},
            "dpo": {"pairs": pairs, "from_groups": pairs is None, "pairs_per_step": 4, **dpo},
            "optim": {"lr": 1e-3},
            "update": {"token_budget": 1024},
            "actor": {"gradient_checkpointing": False},
        }
    )


@pytest.mark.parametrize(
    ("variant", "length_norm"), [("sigmoid", False), ("ipo", False), ("sigmoid", True)]
)
def test_dpo_on_a_tiny_preference_set_raises_the_margin(
    model_dir, pairs_file, variant, length_norm
):
    trainer = Trainer(
        _cfg(pairs_file, variant=variant, length_norm=length_norm, beta=0.5), model_dir,
        available_memory=8e9,
    )  # fmt: skip
    ref0 = {k: v.clone() for k, v in trainer.ref.state_dict().items()}  # type: ignore[union-attr]
    steps = [trainer.step([]) for _ in range(6)]
    first, last = steps[0], steps[-1]
    assert first["dpo/pairs"] == 4.0 and first["dpo/file_pairs"] == 4.0
    # Step 1's metrics are of the starting weights: policy = reference, margin 0.
    assert first["rewards/margin"] == pytest.approx(0.0, abs=1e-5)
    assert last["rewards/margin"] > 0.1
    assert last["rewards/accuracy"] == 1.0
    assert last["rewards/chosen"] > last["rewards/rejected"]
    assert last["dpo/loss"] < first["dpo/loss"]
    margins = [s["rewards/margin"] for s in steps]
    if variant == "sigmoid":
        assert margins == sorted(margins)  # -log σ(βh) keeps pushing h up
    else:
        # IPO regresses h onto 1/(2β): the implicit margin β·h settles near 1/2.
        assert last["rewards/margin"] == pytest.approx(0.5, abs=0.1)
    # The reference stays the starting weights.
    for k, v in trainer.ref.state_dict().items():  # type: ignore[union-attr]
        torch.testing.assert_close(v, ref0[k], atol=0, rtol=0)


def test_dpo_from_groups_skips_ties_and_singles_and_counts_them():
    trainer = Trainer(_cfg(None), tiny_lm(), available_memory=8e9)
    batch = random_batch(8)  # two groups of 4, rewards 0/1 alternating: one pair each
    p0 = params(trainer)
    m = trainer.step(batch)
    assert m["dpo/pairs"] == 2.0 and m["dpo/groups_no_spread"] == 0.0
    assert "step/skipped" not in m
    assert max(float((params(trainer)[k] - p0[k]).abs().max()) for k in p0) > 0
    for t in batch:
        t.reward = 1.0  # every group tied
    batch.append(random_batch(9)[8])  # a group of one
    p1 = params(trainer)
    m = trainer.step(batch)
    assert m["step/skipped"] == 1.0 and m["dpo/pairs"] == 0.0
    assert m["dpo/groups_no_spread"] == 2.0 and m["dpo/groups_single"] == 1.0
    for k, v in params(trainer).items():
        torch.testing.assert_close(v, p1[k], atol=0, rtol=0)  # nothing changed


def test_dpo_pairs_file_needs_a_model_directory(pairs_file):
    with pytest.raises(PairsFileError, match="needs the model given as a directory"):
        Trainer(_cfg(pairs_file), tiny_lm(), available_memory=8e9)


def test_dpo_bad_pairs_file_fails_at_trainer_start(model_dir, tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "q", "chosen": "a"}\n')
    with pytest.raises(PairsFileError, match="missing rejected"):
        Trainer(_cfg(str(bad)), model_dir, available_memory=8e9)


def test_bad_pairs_file_stops_agentrl_train_before_any_server(model_dir, tmp_path):
    from typer.testing import CliRunner

    from agentrl.cli.app import app

    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "q", "chosen": "a"}\n')
    args = [
        "train", "--env", "retool", f"model.path={model_dir}", f"output_dir={tmp_path}",
        'inference.urls=["http://127.0.0.1:9"]',  # never reached: the file fails first
        "trainer.loss.name=dpo", f"trainer.dpo.pairs={bad}",
    ]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "trainer.dpo.pairs" in res.output and "missing rejected" in res.output
    assert "cannot reach" not in res.output and "Traceback" not in res.output
