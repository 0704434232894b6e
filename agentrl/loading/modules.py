"""Importing a user's Python file (an env or an agent given as ``path/to/file.py:Name``)."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

__all__ = ["import_file"]


def import_file(path_str: str, spec: str, *, kind: str, error: type[Exception]) -> Any:
    """Imports ``path_str`` as a module named after its resolved path (imported once).

    Args:
        path_str: The file, as the user wrote it.
        spec: The whole spec, for error messages.
        kind: What the file holds ("env", "agent"): the message prefix and module name.
        error: Exception raised when the file is missing or is not a Python module.
    """
    path = Path(path_str).expanduser().resolve()
    if not path.is_file():
        raise error(f"{kind} spec {spec!r}: file {path_str!r} does not exist")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    name = f"_agentrl_user_{kind}_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    file_spec = importlib.util.spec_from_file_location(name, path)
    if file_spec is None or file_spec.loader is None:
        raise error(f"{kind} spec {spec!r}: cannot load {path_str!r} as a Python module")
    module = importlib.util.module_from_spec(file_spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up here
    try:
        file_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
