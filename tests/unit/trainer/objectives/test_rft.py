"""Rejection-sampling fine-tuning: the loss on model tokens only, per_turn samples apart,
episode selection from a run directory, the saved model, and the errors of ``agentrl sft``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from agentrl.cli.app import app
from agentrl.orchestration.rft import SFTError, read_run_episodes, run_sft, select_episodes
from agentrl.reporting.run_dir import RunDir
from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.objectives.rft import sft_step
from agentrl.types import Trajectory
from tests.helpers.trainer import episode, tiny_lm, tiny_model_dir

CFG = TrainerConfig.model_validate(
    {
        "optim": {"lr": 1e-9},
        "update": {"token_budget": 512},
        "actor": {"gradient_checkpointing": False},
    }
)


def _per_turn() -> Trajectory:
    # Sample 1: prompt [5, 6, 7], model [20, 21]. Sample 2: the template's re-rendering
    # [5, 6, 7, 20, 21, 8] (all context, mask 0), then model [22, 23, 24].
    s1, m1 = [5, 6, 7, 20, 21], [0, 0, 0, 1, 1]
    s2, m2 = [5, 6, 7, 20, 21, 8, 22, 23, 24], [0, 0, 0, 0, 0, 0, 1, 1, 1]
    mask = m1 + m2
    return Trajectory(
        task_id="t", group_id="g", episode_id="pt", token_ids=s1 + s2, loss_mask=mask,
        rollout_logprobs=[-1.0 * m for m in mask], weight_versions=[0 if m else -1 for m in mask],
        prompt_length=3, reward=1.0, strategy="per_turn", sample_starts=[0, len(s1)],
    )  # fmt: skip


def _nll_by_hand(lm: torch.nn.Module, samples: list[tuple[list[int], list[int]]]) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, mask in samples:
            logits = lm(input_ids=torch.tensor([ids])).logits[0].float()
            logp = torch.log_softmax(logits, -1)
            for t in range(1, len(ids)):
                if mask[t]:
                    total -= float(logp[t - 1, ids[t]])
                    count += 1
    return total / count


@pytest.mark.parametrize("packing", [False, True])
def test_sft_loss_is_the_nll_of_model_tokens_with_per_turn_samples_apart(packing):
    lm = tiny_lm()
    t = _per_turn()
    cfg = CFG.model_copy(update={"update": CFG.update.model_copy(update={"packing": packing})})
    trainer = Trainer(cfg, lm, available_memory=8e9)
    m = sft_step(trainer, [t, episode(1, "g", [3, 4], [30, 31, 32], 0.0)])
    want = _nll_by_hand(
        lm,
        [
            ([5, 6, 7, 20, 21], [0, 0, 0, 1, 1]),
            ([5, 6, 7, 20, 21, 8, 22, 23, 24], [0, 0, 0, 0, 0, 0, 1, 1, 1]),
            ([3, 4, 30, 31, 32], [0, 0, 1, 1, 1]),
        ],
    )
    assert m["sft/nll"] == pytest.approx(want, rel=1e-5)
    assert m["sft/tokens"] == 8.0 and m["sft/episodes"] == 2.0
    # Read as one sequence (no restarts) the second sample would attend to the first:
    # the trainer follows sample_starts, so the two readings give their own values.
    flat = _per_turn()
    flat.sample_starts, flat.strategy = [], "as_sampled"
    m_pt = sft_step(Trainer(cfg, lm, available_memory=8e9), [_per_turn()])
    m_flat = sft_step(Trainer(cfg, lm, available_memory=8e9), [flat])
    want_pt = _nll_by_hand(lm, [(t.token_ids[a:b], t.loss_mask[a:b]) for a, b in t.samples()])
    want_flat = _nll_by_hand(lm, [(flat.token_ids, flat.loss_mask)])
    assert m_pt["sft/nll"] == pytest.approx(want_pt, rel=1e-5)
    assert m_flat["sft/nll"] == pytest.approx(want_flat, rel=1e-5)
    assert abs(want_pt - want_flat) > 1e-3


def test_sft_step_without_model_tokens_is_an_error():
    trainer = Trainer(CFG, tiny_lm(), available_memory=8e9)
    empty = episode(0, "g", [1, 2], [], 1.0)
    with pytest.raises(ValueError, match="no episode with model tokens"):
        sft_step(trainer, [empty])


def _run_dir(tmp_path: Path) -> Path:
    run = RunDir(tmp_path / "run")
    run.save_trajectories(1, [episode(i, f"g{i // 2}", [1, 2, 3], [40 + i, 41], float(i % 2))
                              for i in range(4)])  # fmt: skip
    run.save_trajectories(2, [episode(4, "g9", [1, 2], [50, 51, 52], 2.0),
                              episode(5, "g9", [1, 2], [], 5.0)])  # fmt: skip
    return run.path


def test_select_episodes_by_reward(tmp_path):
    eps = read_run_episodes(_run_dir(tmp_path))
    assert len(eps) == 6
    kept = select_episodes(eps, 1.0)
    assert [t.episode_id for t in kept] == ["ep1", "ep3", "ep4"]  # ep5: no model token
    assert [t.episode_id for t in select_episodes(eps, 2.0)] == ["ep4"]


def test_run_sft_trains_and_saves_a_loadable_model(tmp_path):
    from transformers import AutoModelForCausalLM

    run = _run_dir(tmp_path)
    model = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "sft"
    res = run_sft(
        run, min_reward=1.0, output_dir=out, model=str(model), epochs=4, batch_size=3, lr=1e-2,
        say=lambda _m: None,
    )  # fmt: skip
    assert (res.episodes_total, res.episodes_kept, res.steps) == (6, 3, 4)
    assert res.nll_last < res.nll_first
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()
    saved = AutoModelForCausalLM.from_pretrained(str(out))
    base = AutoModelForCausalLM.from_pretrained(str(model))
    moved = max(
        float((a - b).abs().max())
        for a, b in zip(saved.state_dict().values(), base.state_dict().values(), strict=True)
    )
    assert moved > 1e-4


def test_run_sft_errors(tmp_path):
    with pytest.raises(SFTError, match="does not exist"):
        run_sft(tmp_path / "nope", min_reward=0.0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SFTError, match="no trajectories in"):
        run_sft(tmp_path / "empty", min_reward=0.0)
    with pytest.raises(SFTError, match=r"no episode of 6 has reward >= 9.0.*best reward: 5.0"):
        run_sft(_run_dir(tmp_path), min_reward=9.0)
    with pytest.raises(SFTError, match=r"no config.yaml to find its model"):
        run_sft(_run_dir(tmp_path), min_reward=0.0, say=lambda _m: None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "/nonexistent/run"], "does not exist"),
        (["--min-reward", "9"], "no episode of 6 has reward >= 9.0"),
    ],
)
def test_cli_sft_errors_are_one_message(tmp_path, args, message):
    run = _run_dir(tmp_path)
    full = ["sft", *args] if "--from" in args else ["sft", "--from", str(run), *args]
    res = CliRunner().invoke(app, full)
    assert res.exit_code == 2
    assert "error:" in res.output and message in res.output
    assert "Traceback" not in res.output
