"""`agentrl export RUN_DIR --out DIR [--merge | --adapter] [--step N] [--force]`: a run's
checkpoint as a merged HF model or a peft adapter, and each bad input as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentrl.cli.app import app
from agentrl.cli.errors import run_cli
from agentrl.config import RunConfig
from agentrl.config.run import dump_config
from agentrl.trainer import Trainer, TrainerConfig
from tests.helpers.trainer import VOCAB, random_batch, tiny_model_dir

torch.set_num_threads(2)

IDS = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))


def _run(tmp: Path, lora: bool, steps: int = 1) -> tuple[Path, Trainer]:
    """A run directory as `agentrl train` leaves it: config.yaml and checkpoints/step_N."""
    model = tiny_model_dir(tmp / "model")
    run = tmp / "run"
    run.mkdir()
    dump_config(RunConfig(model={"path": str(model)}), run / "config.yaml")
    cfg = TrainerConfig(
        seed=2,
        optim={"lr": 1e-2},
        kl={"coef": 0.05},
        lora={"rank": 4} if lora else None,
        checkpoint={"dir": str(run / "checkpoints"), "keep_last": 5},
    )
    t = Trainer(cfg, str(model))
    for _ in range(steps):
        t.step(random_batch(6))
        t.save_checkpoint()
    return run, t


def _logits(lm: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return lm.eval()(input_ids=IDS).logits


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        run_cli(app, ["export", *args])
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_merge_and_adapter_of_a_lora_run_match_the_trained_policy(tmp_path, capsys) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run, t = _run(tmp_path, lora=True)
    want = _logits(t.lora)
    base = _logits(AutoModelForCausalLM.from_pretrained(str(tmp_path / "model")))
    assert (want - base).abs().max() > 1e-3  # the step moved the adapter

    code, out = _cli([str(run), "--out", str(tmp_path / "merged"), "--merge"], capsys)
    assert code == 0, out
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    assert not any("lora" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(_logits(merged), want, atol=1e-4, rtol=0)
    assert (tmp_path / "merged" / "tokenizer_config.json").is_file()

    code, out = _cli([str(run), "--out", str(tmp_path / "adapter"), "--adapter"], capsys)
    assert code == 0, out
    conf = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert conf["base_model_name_or_path"] == str((tmp_path / "model").resolve())
    assert conf["r"] == 4
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(conf["base_model_name_or_path"]),
        str(tmp_path / "adapter"),
    )
    torch.testing.assert_close(_logits(peft_model), want, atol=1e-4, rtol=0)


def test_step_picks_an_older_checkpoint_and_a_missing_one_lists_those_there(
    tmp_path, capsys
) -> None:
    from transformers import AutoModelForCausalLM

    run, t = _run(tmp_path, lora=False, steps=2)
    code, out = _cli([str(run), "--out", str(tmp_path / "s7"), "--step", "7"], capsys)
    assert code == 2 and "error: --step 7:" in out and "it has steps 1, 2" in out, out
    assert "Traceback" not in out and not (tmp_path / "s7").exists()
    code, out = _cli([str(run), "--out", str(tmp_path / "s2"), "--step", "2"], capsys)
    assert code == 0, out
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "s2"))
    torch.testing.assert_close(_logits(exported), _logits(t.policy.lm), atol=1e-5, rtol=0)
    code, out = _cli([str(run), "--out", str(tmp_path / "s1"), "--step", "1"], capsys)
    assert code == 0, out
    older = _logits(AutoModelForCausalLM.from_pretrained(str(tmp_path / "s1")))
    assert (older - _logits(exported)).abs().max() > 1e-4


def test_bad_inputs_are_one_line_each(tmp_path, capsys) -> None:
    run, _ = _run(tmp_path, lora=False)
    code, out = _cli([str(run), "--out", str(tmp_path / "a"), "--adapter"], capsys)
    assert code == 2 and "trained every weight" in out and "--merge" in out, out
    code, out = _cli([str(run), "--out", str(tmp_path / "b"), "--merge", "--adapter"], capsys)
    assert code == 2 and "choose one" in out, out

    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    code, out = _cli([str(run), "--out", str(full)], capsys)
    assert code == 2 and "not empty" in out and "--force" in out, out
    code, out = _cli([str(run), "--out", str(full), "--force"], capsys)
    assert code == 0 and (full / "config.json").is_file(), out

    empty = tmp_path / "empty-run"
    empty.mkdir()
    (empty / "config.yaml").write_text((run / "config.yaml").read_text())
    code, out = _cli([str(empty), "--out", str(tmp_path / "c")], capsys)
    assert code == 2 and "has no checkpoint" in out, out
    code, out = _cli([str(tmp_path / "nowhere"), "--out", str(tmp_path / "d")], capsys)
    assert code == 2 and "no such run directory" in out, out
    assert "Traceback" not in out
