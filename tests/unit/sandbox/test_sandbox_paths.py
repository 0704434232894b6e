"""workdir_path: the one check both sandboxes apply to a file path before any call."""

from __future__ import annotations

import pytest

from agentrl.sandbox.base import WORKDIR, workdir_path


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("a.txt", "/workspace/a.txt"),
        ("./d/../b", "/workspace/b"),
        ("/workspace/x/", "/workspace/x"),
        (".", "/workspace"),
        ("/workspace", "/workspace"),
    ],
)
def test_paths_under_the_workdir_are_normalised(path: str, want: str) -> None:
    assert workdir_path(path) == want


@pytest.mark.parametrize(
    "path", ["..", "../etc/passwd", "/etc/passwd", "d/../../x", "/workspace2/a", "a\0b"]
)
def test_paths_leaving_the_workdir_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match=f"outside the sandbox working directory {WORKDIR}"):
        workdir_path(path)
