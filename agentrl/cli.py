"""The ``agentrl`` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

app = typer.Typer(
    name="agentrl",
    help="Reinforcement learning for multi-turn, tool-using LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
doctor_app = typer.Typer(help="Check a tokenizer, an env or a config without running anything.")
sandbox_app = typer.Typer(help="Build and inspect sandbox images.")
app.add_typer(doctor_app, name="doctor")
app.add_typer(sandbox_app, name="sandbox")
console = Console()


def _fail(message: str) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=2)


def _load_tokenizer(model: str) -> Any:
    if model == "tiny":
        from agentrl.models.tokenizer import build_tokenizer

        return build_tokenizer()
    path = Path(model)
    if not path.exists():
        raise _fail(f"model path {model!r} does not exist (give a directory with a tokenizer)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@app.command("envs")
def envs_cmd() -> None:
    """List the environments ``--env`` accepts by name."""
    from agentrl.env_registry import list_envs

    for name in list_envs():
        console.print(name)


@doctor_app.command("tokenizer")
def doctor_tokenizer(
    model: Annotated[
        str, typer.Option("--model", help="Model/tokenizer directory, or 'tiny' for the default.")
    ] = "tiny",
) -> None:
    """Check that the chat template allows exact per-turn (delta) tokenization."""
    from agentrl.rollout.consistency import check_chat_template

    report = check_chat_template(_load_tokenizer(model))
    console.print(report.summary(), markup=False)
    if not report.ok:
        raise typer.Exit(code=1)


@doctor_app.command("env")
def doctor_env(
    env: Annotated[str, typer.Option("--env", help="Env name, pkg.module:Class or file.py:Class.")],
) -> None:
    """Run ``agentrl.testing.check_env`` on an env."""
    from agentrl.env_registry import EnvNotFoundError, InvalidEnvError, resolve_env
    from agentrl.testing import EnvCheckError, check_env

    try:
        cls = resolve_env(env)
        check_env(cls)
    except (EnvNotFoundError, InvalidEnvError, EnvCheckError) as e:
        raise _fail(str(e)) from e
    console.print(f"{env}: ok")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
