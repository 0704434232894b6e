"""A file editor for agents (view / create / str_replace / insert / undo_edit).

It works over a small :class:`FileSystem` interface, so it runs against a container
(``envs.swe.sandbox_fs.SandboxFS``) or an in-memory double (:class:`MemoryFS`, for
tests). Every path must lie inside the editor's root; others raise :class:`EditorError`.
"""

from __future__ import annotations

import posixpath
from typing import Literal, Protocol

__all__ = ["Command", "Editor", "EditorError", "FileSystem", "MemoryFS"]

Command = Literal["view", "create", "str_replace", "insert", "undo_edit"]
Kind = Literal["file", "dir", "missing"]

_SNIPPET_CONTEXT = 4


class EditorError(ValueError):
    """A bad editor request (the message is what the agent sees)."""


class FileSystem(Protocol):
    """What the editor needs from a file system (absolute paths)."""

    async def kind(self, path: str) -> Kind: ...

    async def read_text(self, path: str) -> str: ...

    async def write_text(self, path: str, text: str) -> None: ...

    async def delete(self, path: str) -> None: ...

    async def list_dir(self, path: str, depth: int) -> list[str]:
        """Paths under ``path`` (relative to it, up to ``depth`` levels, no hidden ones)."""
        ...


class MemoryFS:
    """An in-memory :class:`FileSystem`: ``files`` maps absolute paths to text."""

    def __init__(self, files: dict[str, str] | None = None) -> None:
        self.files = dict(files or {})

    async def kind(self, path: str) -> Kind:
        if path in self.files:
            return "file"
        return "dir" if any(f.startswith(path.rstrip("/") + "/") for f in self.files) else "missing"

    async def read_text(self, path: str) -> str:
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]

    async def write_text(self, path: str, text: str) -> None:
        self.files[path] = text

    async def delete(self, path: str) -> None:
        self.files.pop(path, None)

    async def list_dir(self, path: str, depth: int) -> list[str]:
        prefix = path.rstrip("/") + "/"
        out: set[str] = set()
        for f in self.files:
            if f.startswith(prefix):
                parts = f[len(prefix) :].split("/")
                for i in range(1, min(depth, len(parts)) + 1):
                    if not any(p.startswith(".") for p in parts[:i]):
                        out.add("/".join(parts[:i]))
        return sorted(out)


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(lines, first))


def _line_count(text: str) -> int:
    return len(text.splitlines())


class Editor:
    """The ``str_replace_editor`` tool's logic, confined to ``root``.

    Args:
        fs: Where the files are.
        root: Directory every path must lie in; relative paths are taken from it.
        max_view_chars: A longer ``view`` output is cut, with a hint to use ``view_range``.
    """

    def __init__(self, fs: FileSystem, root: str, *, max_view_chars: int = 16000) -> None:
        self.fs = fs
        self.root = posixpath.normpath(root)
        self.max_view_chars = max_view_chars
        self._history: dict[str, list[str | None]] = {}

    def fork(self, fs: FileSystem) -> Editor:
        """An editor over ``fs`` (a copy of this one's files) with a copy of the undo history."""
        child = Editor(fs, self.root, max_view_chars=self.max_view_chars)
        child._history = {path: list(edits) for path, edits in self._history.items()}
        return child

    def resolve(self, path: str) -> str:
        """The absolute path for ``path``; raises EditorError if it is outside ``root``."""
        if not isinstance(path, str) or not path.strip() or "\0" in path:
            raise EditorError(f"invalid path {path!r}")
        norm = posixpath.normpath(posixpath.join(self.root, path.strip()))
        if norm != self.root and not norm.startswith(self.root + "/"):
            raise EditorError(
                f"path {path!r} is outside the repository {self.root}; "
                f"use a path inside it (absolute, or relative to {self.root})"
            )
        return norm

    async def run(
        self,
        command: str,
        path: str,
        *,
        file_text: str | None = None,
        old_str: str | None = None,
        new_str: str | None = None,
        insert_line: int | None = None,
        view_range: list[int] | None = None,
    ) -> str:
        """Runs one editor command and returns the text the agent sees."""
        p = self.resolve(path)
        if command == "view":
            return await self.view(p, view_range)
        if command == "create":
            if file_text is None:
                raise EditorError("parameter 'file_text' is required for command 'create'")
            return await self.create(p, file_text)
        if command == "str_replace":
            if old_str is None:
                raise EditorError("parameter 'old_str' is required for command 'str_replace'")
            return await self.str_replace(p, old_str, new_str or "")
        if command == "insert":
            if insert_line is None or new_str is None:
                raise EditorError("parameters 'insert_line' and 'new_str' are required for insert")
            return await self.insert(p, insert_line, new_str)
        if command == "undo_edit":
            return await self.undo_edit(p)
        raise EditorError(
            f"unknown command {command!r}; use view, create, str_replace, insert or undo_edit"
        )

    def _rel(self, p: str) -> str:
        return posixpath.relpath(p, self.root)

    async def _read(self, p: str) -> str:
        kind = await self.fs.kind(p)
        if kind == "missing":
            raise EditorError(f"no such file: {p}")
        if kind == "dir":
            raise EditorError(f"{p} is a directory, not a file")
        return await self.fs.read_text(p)

    async def _write(self, p: str, text: str, previous: str | None) -> None:
        if "/.git/" in p + "/":
            raise EditorError(f"{p} is inside .git; the editor does not change git's files")
        await self.fs.write_text(p, text)
        self._history.setdefault(p, []).append(previous)

    async def view(self, p: str, view_range: list[int] | None = None) -> str:
        """A file with line numbers (optionally lines ``[start, end]``; end -1: to the end),
        or a directory's entries up to 2 levels deep."""
        if await self.fs.kind(p) == "dir":
            if view_range is not None:
                raise EditorError("view_range applies to files, not directories")
            entries = await self.fs.list_dir(p, 2)
            head = f"Files and directories up to 2 levels deep in {p}, excluding hidden items:"
            return "\n".join([head, *entries])
        lines = (await self._read(p)).splitlines()
        first = 1
        if view_range is not None:
            if len(view_range) != 2 or not all(isinstance(x, int) for x in view_range):
                raise EditorError("view_range must be two integers [start, end]")
            start, end = view_range
            n = len(lines)
            if not 1 <= start <= max(n, 1):
                raise EditorError(f"view_range start {start} is not in [1, {n}] ({n} lines)")
            if end != -1 and not start <= end <= n:
                raise EditorError(f"view_range end {end} must be -1 or in [{start}, {n}]")
            lines = lines[start - 1 : (n if end == -1 else end)]
            first = start
        out = _numbered(lines, first)
        if len(out) > self.max_view_chars:
            out = out[: self.max_view_chars] + (
                "\n<file too long: output cut; use view_range to see the rest>"
            )
        return out

    async def create(self, p: str, file_text: str) -> str:
        """Creates a new file (an existing path is an error: edit it instead)."""
        if await self.fs.kind(p) != "missing":
            raise EditorError(f"{p} already exists; use str_replace or insert to change it")
        await self._write(p, file_text, None)
        return f"File created successfully at: {p}"

    async def str_replace(self, p: str, old_str: str, new_str: str) -> str:
        """Replaces the one occurrence of ``old_str``; none or several is an error."""
        text = await self._read(p)
        if not old_str:
            raise EditorError("old_str must not be empty")
        count = text.count(old_str)
        if count == 0:
            raise EditorError(f"no replacement was performed: old_str did not appear in {p}")
        if count > 1:
            lines, start = [], 0
            for _ in range(count):
                i = text.index(old_str, start)
                lines.append(text.count("\n", 0, i) + 1)
                start = i + 1
            raise EditorError(
                f"no replacement was performed: old_str occurs {count} times in {p} (lines "
                f"{lines}); include more surrounding lines to make it unique"
            )
        i = text.index(old_str)
        new_text = text[:i] + new_str + text[i + len(old_str) :]
        await self._write(p, new_text, text)
        first = text.count("\n", 0, i) + 1
        return self._snippet(p, new_text, first, first + new_str.count("\n"))

    async def insert(self, p: str, insert_line: int, new_str: str) -> str:
        """Inserts ``new_str`` after line ``insert_line`` (0: at the top)."""
        text = await self._read(p)
        n = _line_count(text)
        if not 0 <= insert_line <= n:
            raise EditorError(f"insert_line {insert_line} is not in [0, {n}] ({n} lines)")
        lines = text.splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n") and insert_line == n:
            lines[-1] += "\n"
        block = new_str if new_str.endswith("\n") else new_str + "\n"
        new_text = "".join(lines[:insert_line]) + block + "".join(lines[insert_line:])
        await self._write(p, new_text, text)
        return self._snippet(p, new_text, insert_line + 1, insert_line + _line_count(block))

    async def undo_edit(self, p: str) -> str:
        """Reverts the last create/str_replace/insert of ``p``."""
        history = self._history.get(p)
        if not history:
            raise EditorError(f"no edit of {p} to undo")
        previous = history.pop()
        if previous is None:
            await self.fs.delete(p)
            return f"Last edit of {p} undone: the file it created is removed."
        await self.fs.write_text(p, previous)
        return f"Last edit of {p} undone.\n" + self._snippet(p, previous, 1, 1, head=False)

    def _snippet(self, p: str, text: str, first: int, last: int, *, head: bool = True) -> str:
        lines = text.splitlines()
        lo = max(1, first - _SNIPPET_CONTEXT)
        hi = min(len(lines), last + _SNIPPET_CONTEXT)
        body = _numbered(lines[lo - 1 : hi], lo)
        return (f"The file {p} has been edited. Lines {lo}-{hi} now read:\n" if head else "") + body
