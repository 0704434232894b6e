"""SweTask: a repository snapshot, an issue, a gold patch and hidden tests (see docs/swe.md).

A task's snapshot comes from exactly one of: ``repo_files`` (path → text, inline),
``repo_dir`` (a host directory), or ``image_repo_path`` (a directory inside the task's
prebuilt ``image``, as in SWE-bench images). Hidden tests are ``hidden_tests`` (path →
text, written over the repository) and/or ``test_patch`` (a diff applied after them).
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .patch import PatchError, split_patch

__all__ = [
    "DEFAULT_PROTECTED",
    "SweTask",
    "TaskFormatError",
    "check_rel_path",
    "default_test_command",
]

DEFAULT_PROTECTED: tuple[str, ...] = (
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    "sitecustomize.py",
    "usercustomize.py",
    "*.pth",
)
"""Paths an agent's patch may never change (a pattern without ``/`` matches a file name at
any depth): test configuration and interpreter start-up hooks that could fake a pass."""

_SKIP_PARTS = {".git", "__pycache__", ".pytest_cache"}


class TaskFormatError(ValueError):
    """A task is missing a field or has a malformed one; the message names the task."""


def check_rel_path(path: object, where: str) -> str:
    """Returns ``path`` normalized if it is a safe repository-relative path.

    Raises:
        TaskFormatError: Empty, absolute, escaping (``..``), inside ``.git`` or not a string.
    """
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise TaskFormatError(f"{where}: {path!r} is not a file path")
    norm = posixpath.normpath(path)
    if norm.startswith("/") or norm == "." or norm.split("/")[0] == "..":
        raise TaskFormatError(f"{where}: path {path!r} must be relative and inside the repo")
    if ".git" in norm.split("/"):
        raise TaskFormatError(f"{where}: path {path!r} is inside .git")
    return norm


def default_test_command(paths: list[str] | tuple[str, ...]) -> str:
    """``python3 -m pytest -q -p no:cacheprovider <paths>`` (run in the repository root)."""
    quoted = " ".join("'" + p.replace("'", "'\\''") + "'" for p in paths)
    return f"python3 -m pytest -q -p no:cacheprovider {quoted}".rstrip()


@dataclass(frozen=True)
class SweTask:
    """One SWE task.

    Attributes:
        id: Unique id.
        issue: The issue statement shown to the agent.
        gold_patch: A ``git diff`` that fixes the issue (used by validation only).
        hidden_tests: Path → content of test files the agent never sees; written over the
            repository after the agent's patch is applied.
        repo_files: The snapshot as path → text (one snapshot source of three).
        repo_dir: The snapshot as a host directory.
        image_repo_path: The snapshot as a directory inside ``image`` (SWE-bench images).
        visible_tests: Test files in the snapshot the agent may run (named in the prompt).
        test_patch: A diff adding/changing tests, applied after ``hidden_tests``.
        test_command: Shell command run in the repository root; passing means exit 0 (and,
            for pytest, at least one test passed and none failed). Default:
            :func:`default_test_command` of the hidden test paths.
        image: Docker image of the agent's and grader's containers (None: agentrl/python).
        test_timeout_s: Wall-clock limit of the test command.
        protected: Path patterns the agent's patch may not change (see DEFAULT_PROTECTED);
            hidden test paths and ``test_patch`` paths are always protected too.
        metadata: Anything else (e.g. SWE-bench's FAIL_TO_PASS).
    """

    id: str
    issue: str
    gold_patch: str
    hidden_tests: Mapping[str, str] = field(default_factory=dict)
    repo_files: Mapping[str, str] | None = None
    repo_dir: Path | None = None
    image_repo_path: str | None = None
    visible_tests: tuple[str, ...] = ()
    test_patch: str = ""
    test_command: str | None = None
    image: str | None = None
    test_timeout_s: float = 60.0
    protected: tuple[str, ...] = DEFAULT_PROTECTED
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check()

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """Raises TaskFormatError naming the task if a field is missing or malformed."""
        where = f"SWE task {self.id!r}"
        if not isinstance(self.id, str) or not self.id.strip():
            raise TaskFormatError(f"SWE task: 'id' must be a non-empty string, got {self.id!r}")
        if not isinstance(self.issue, str) or not self.issue.strip():
            raise TaskFormatError(f"{where}: 'issue' must be a non-empty string")
        sources = [self.repo_files is not None, self.repo_dir is not None]
        sources.append(self.image_repo_path is not None)
        if sum(sources) != 1:
            raise TaskFormatError(
                f"{where}: give exactly one snapshot source: 'repo_files', 'repo_dir' or "
                f"'image_repo_path' (with 'image'); got {sum(sources)}"
            )
        if self.image_repo_path is not None and not self.image:
            raise TaskFormatError(f"{where}: 'image_repo_path' needs 'image'")
        if self.repo_dir is not None and not Path(self.repo_dir).is_dir():
            raise TaskFormatError(f"{where}: repo_dir {str(self.repo_dir)!r} is not a directory")
        if self.repo_files is not None:
            if not isinstance(self.repo_files, Mapping) or not self.repo_files:
                raise TaskFormatError(f"{where}: 'repo_files' must be a non-empty path → text map")
            for p, c in self.repo_files.items():
                check_rel_path(p, f"{where}: repo_files")
                if not isinstance(c, str):
                    raise TaskFormatError(f"{where}: repo_files[{p!r}] must be text")
        if not isinstance(self.hidden_tests, Mapping):
            raise TaskFormatError(f"{where}: 'hidden_tests' must be a path → text map")
        for p, c in self.hidden_tests.items():
            check_rel_path(p, f"{where}: hidden_tests")
            if not isinstance(c, str) or not c.strip():
                raise TaskFormatError(f"{where}: hidden_tests[{p!r}] must be non-empty text")
        if not self.hidden_tests and not self.test_patch.strip():
            raise TaskFormatError(f"{where}: no hidden tests ('hidden_tests' or 'test_patch')")
        for p in self.visible_tests:
            check_rel_path(p, f"{where}: visible_tests")
        if not self.test_timeout_s > 0:
            raise TaskFormatError(f"{where}: 'test_timeout_s' must be positive")
        self._check_patches(where)

    def _check_patches(self, where: str) -> None:
        if not isinstance(self.gold_patch, str) or not self.gold_patch.strip():
            raise TaskFormatError(f"{where}: 'gold_patch' must be a non-empty unified diff")
        for name, text in (("gold_patch", self.gold_patch), ("test_patch", self.test_patch)):
            try:
                sections = split_patch(text)
            except PatchError as e:
                raise TaskFormatError(f"{where}: '{name}' is not a git diff: {e}") from None
            for fp in sections:
                for p in fp.paths:
                    check_rel_path(p, f"{where}: {name}")
        files = self.snapshot_paths()
        for fp in split_patch(self.gold_patch):
            if fp.old_path is not None and files is not None and fp.old_path not in files:
                raise TaskFormatError(
                    f"{where}: gold_patch changes {fp.old_path!r}, which is not in the snapshot"
                )
            bad = [p for p in fp.paths if self.is_protected(p)]
            if bad:
                raise TaskFormatError(
                    f"{where}: gold_patch changes protected path(s) {bad} (hidden tests or test "
                    "configuration), which the grader drops from every patch"
                )

    # ------------------------------------------------------------------ views
    def snapshot_paths(self) -> set[str] | None:
        """Paths of the snapshot's files (None when the snapshot lives in an image)."""
        if self.repo_files is not None:
            return {posixpath.normpath(p) for p in self.repo_files}
        if self.repo_dir is not None:
            root = Path(self.repo_dir)
            return {
                p.relative_to(root).as_posix()
                for p in root.rglob("*")
                if p.is_file() and not _SKIP_PARTS & set(p.relative_to(root).parts)
            }
        return None

    def snapshot_files(self) -> dict[str, bytes]:
        """The snapshot's files as path → bytes (empty when it lives in an image)."""
        if self.repo_files is not None:
            return {posixpath.normpath(p): c.encode() for p, c in self.repo_files.items()}
        if self.repo_dir is not None:
            root = Path(self.repo_dir)
            return {p: (root / p).read_bytes() for p in sorted(self.snapshot_paths() or ())}
        return {}

    def test_paths(self) -> list[str]:
        """Hidden test files and files the test patch touches."""
        out = list(self.hidden_tests)
        if self.test_patch.strip():
            out += [p for fp in split_patch(self.test_patch) for p in fp.paths]
        return list(dict.fromkeys(posixpath.normpath(p) for p in out))

    def command(self) -> str:
        """The test command (the task's, else pytest on the hidden tests)."""
        return self.test_command or default_test_command(self.test_paths())

    def is_protected(self, path: str) -> bool:
        """Whether the agent's patch may not change ``path`` (hidden tests, test config).

        A hidden test path, any path inside it or any of its parent paths are protected
        (so no file or directory can be put where a hidden test is written).
        """
        norm = posixpath.normpath(path)
        for t in self.test_paths():
            if norm == t or t.startswith(norm + "/") or norm.startswith(t + "/"):
                return True
        name = posixpath.basename(norm)
        return any(fnmatch.fnmatchcase(norm if "/" in pat else name, pat) for pat in self.protected)

    def to_row(self) -> dict[str, Any]:
        """The task as a JSON-friendly row of the inline format (see docs/swe.md)."""
        row: dict[str, Any] = {"id": self.id, "issue": self.issue, "gold_patch": self.gold_patch}
        if self.repo_files is not None:
            row["repo_files"] = dict(self.repo_files)
        elif self.repo_dir is not None:
            row["repo_dir"] = str(self.repo_dir)
        else:
            row["image_repo_path"] = self.image_repo_path
        row["hidden_tests"] = dict(self.hidden_tests)
        optional = {
            "visible_tests": list(self.visible_tests),
            "test_patch": self.test_patch,
            "test_command": self.test_command,
            "image": self.image,
            "metadata": dict(self.metadata),
        }
        row.update({k: v for k, v in optional.items() if v})
        if self.test_timeout_s != 60.0:
            row["test_timeout_s"] = self.test_timeout_s
        if self.protected != DEFAULT_PROTECTED:
            row["protected"] = list(self.protected)
        return row
