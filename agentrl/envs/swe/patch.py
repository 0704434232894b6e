"""Unified diffs (``git diff`` format): split into per-file sections and filter by path.

The grader uses :func:`filter_patch` to drop every change to a protected path (hidden
tests, test configuration) before it applies an agent's patch, so writing to those
paths can never help the agent.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["FilePatch", "PatchError", "filter_patch", "patch_paths", "split_patch"]

_HEADER = "diff --git "
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f"}
_ESCAPES |= {"r": "\r", "v": "\v"}


class PatchError(ValueError):
    """The text is not a unified diff this module understands."""


@dataclass(frozen=True)
class FilePatch:
    """The changes to one file.

    Attributes:
        old_path: Path before the change (None for a new file).
        new_path: Path after the change (None for a deleted file).
        text: The section's text, header included.
        symlink: The section creates or changes a symbolic link.
    """

    old_path: str | None
    new_path: str | None
    text: str
    symlink: bool = False

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path the section touches."""
        return tuple(dict.fromkeys(p for p in (self.old_path, self.new_path) if p is not None))


def _unquote(s: str) -> tuple[str, str]:
    """Reads one git-quoted (``"a/x\\ty"``) or plain token; returns (value, rest)."""
    if not s.startswith('"'):
        value, _, rest = s.partition("\t") if "\t" in s else (s, "", "")
        return value, rest
    out = bytearray()
    i = 1
    while i < len(s):
        c = s[i]
        if c == '"':
            return out.decode("utf-8", errors="replace"), s[i + 1 :]
        if c == "\\" and i + 1 < len(s):
            n = s[i + 1]
            if n in "01234567" and i + 3 < len(s):
                out.append(int(s[i + 1 : i + 4], 8))
                i += 4
                continue
            out += _ESCAPES.get(n, n).encode()
            i += 2
            continue
        out += c.encode()
        i += 1
    raise PatchError(f"unterminated quoted path in {s!r:.200}")


def _strip_prefix(path: str) -> str | None:
    if path == "/dev/null":
        return None
    if len(path) > 2 and path[1] == "/" and path[0] in "abciwo":
        path = path[2:]
    return posixpath.normpath(path)


def _header_paths(line: str) -> tuple[str | None, str | None]:
    """Paths of a ``diff --git a/X b/Y`` line (best effort for unquoted paths with spaces)."""
    rest = line[len(_HEADER) :].rstrip("\n")
    if rest.startswith('"'):
        a, tail = _unquote(rest)
        b, _ = _unquote(tail.lstrip(" "))
        return _strip_prefix(a), _strip_prefix(b)
    if ' "' in rest:
        a, _, b = rest.partition(' "')
        return _strip_prefix(a), _strip_prefix(_unquote('"' + b)[0])
    # "a/P b/P": without renames both halves are equal.
    half = (len(rest) - 1) // 2
    if rest[half] == " " and rest[2:half] == rest[half + 3 :]:
        return _strip_prefix(rest[:half]), _strip_prefix(rest[half + 1 :])
    a, _, b = rest.partition(" b/")
    return _strip_prefix(a), _strip_prefix("b/" + b)


def _section(text: str) -> FilePatch:
    lines = text.splitlines()
    old, new = _header_paths(lines[0])
    symlink = False
    for line in lines[1:]:
        if line.startswith(("@@", "GIT binary patch", "Binary files")):
            break
        if line.startswith("--- "):
            old = _strip_prefix(_unquote(line[4:])[0])
        elif line.startswith("+++ "):
            new = _strip_prefix(_unquote(line[4:])[0])
        elif line.startswith("new file mode"):
            old = None
        elif line.startswith("deleted file mode"):
            new = None
        elif line.startswith(("rename from ", "copy from ")):
            old = posixpath.normpath(_unquote(line.split(" ", 2)[2])[0])
        elif line.startswith(("rename to ", "copy to ")):
            new = posixpath.normpath(_unquote(line.split(" ", 2)[2])[0])
        if re.match(r"(new|old|deleted file|new file) mode 120000", line):
            symlink = True
    if old is None and new is None:
        raise PatchError(f"a diff section names no file: {lines[0]!r:.200}")
    return FilePatch(old, new, text, symlink)


def split_patch(patch: str) -> list[FilePatch]:
    """Splits a ``git diff`` into per-file sections.

    Raises:
        PatchError: Non-empty text with no ``diff --git`` section, or a malformed header.
    """
    if not patch.strip():
        return []
    starts = [m.start() for m in re.finditer(r"^diff --git ", patch, flags=re.M)]
    if not starts:
        raise PatchError("not a git-style unified diff (no 'diff --git' line)")
    bounds = [*starts, len(patch)]
    return [_section(patch[bounds[i] : bounds[i + 1]]) for i in range(len(starts))]


def patch_paths(patch: str) -> list[str]:
    """Every path a patch touches, in order of appearance."""
    return list(dict.fromkeys(p for fp in split_patch(patch) for p in fp.paths))


def filter_patch(patch: str, protected: Callable[[str], bool]) -> tuple[str, list[str]]:
    """Drops sections that touch a protected path or create/change a symbolic link.

    Args:
        patch: A ``git diff``.
        protected: Whether a repository-relative path may not be changed.

    Returns:
        (the patch without those sections, the paths dropped).
    """
    kept: list[str] = []
    dropped: list[str] = []
    for fp in split_patch(patch):
        if fp.symlink or any(protected(p) for p in fp.paths):
            dropped.extend(fp.paths)
        else:
            kept.append(fp.text)
    return "".join(kept), dropped
