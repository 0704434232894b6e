"""The SWE file editor over an in-memory file system (no Docker)."""

from __future__ import annotations

import pytest

from agentrl.envs.swe.editor import Editor, EditorError, MemoryFS

ROOT = "/workspace/repo"


def make(files: dict[str, str] | None = None) -> tuple[Editor, MemoryFS]:
    fs = MemoryFS(
        {f"{ROOT}/{p}": c for p, c in (files or {"a.py": "x = 1\ny = 2\nz = 3\n"}).items()}
    )
    return Editor(fs, ROOT), fs


async def test_view_numbers_lines_and_honours_range() -> None:
    ed, _ = make()
    assert await ed.run("view", "a.py") == "     1\tx = 1\n     2\ty = 2\n     3\tz = 3"
    assert (
        await ed.run("view", f"{ROOT}/a.py", view_range=[2, -1]) == "     2\ty = 2\n     3\tz = 3"
    )
    with pytest.raises(EditorError, match="view_range end 9"):
        await ed.run("view", "a.py", view_range=[1, 9])


async def test_view_directory_lists_two_levels_without_hidden_entries() -> None:
    ed, _ = make({"a.py": "", "pkg/b.py": "", "pkg/sub/deep/c.py": "", ".git/config": ""})
    out = (await ed.run("view", ".")).splitlines()
    assert out[1:] == ["a.py", "pkg", "pkg/b.py", "pkg/sub"]


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../secret.py", "/workspace/repo/../x", "/workspace"]
)
async def test_paths_outside_the_repository_are_refused(path: str) -> None:
    ed, fs = make()
    with pytest.raises(EditorError, match="outside the repository /workspace/repo"):
        await ed.run("create", path, file_text="boom")
    assert all(p.startswith(ROOT + "/") for p in fs.files)


async def test_str_replace_needs_exactly_one_match() -> None:
    ed, fs = make({"a.py": "v = 1\nv = 1\nw = 2\n"})
    with pytest.raises(EditorError, match=r"occurs 2 times .*lines \[1, 2\]"):
        await ed.run("str_replace", "a.py", old_str="v = 1", new_str="v = 3")
    with pytest.raises(EditorError, match="did not appear"):
        await ed.run("str_replace", "a.py", old_str="nope", new_str="")
    assert fs.files[f"{ROOT}/a.py"] == "v = 1\nv = 1\nw = 2\n"  # unchanged by failures
    out = await ed.run("str_replace", "a.py", old_str="w = 2", new_str="w = 20")
    assert fs.files[f"{ROOT}/a.py"] == "v = 1\nv = 1\nw = 20\n"
    assert "     3\tw = 20" in out


async def test_insert_create_and_undo() -> None:
    ed, fs = make()
    await ed.run("insert", "a.py", insert_line=0, new_str="# head")
    await ed.run("insert", "a.py", insert_line=4, new_str="tail = 4")
    assert fs.files[f"{ROOT}/a.py"] == "# head\nx = 1\ny = 2\nz = 3\ntail = 4\n"
    with pytest.raises(EditorError, match="insert_line 9"):
        await ed.run("insert", "a.py", insert_line=9, new_str="x")
    await ed.run("undo_edit", "a.py")
    await ed.run("undo_edit", "a.py")
    assert fs.files[f"{ROOT}/a.py"] == "x = 1\ny = 2\nz = 3\n"
    with pytest.raises(EditorError, match="no edit"):
        await ed.run("undo_edit", "a.py")

    await ed.run("create", "pkg/new.py", file_text="n = 0\n")
    assert fs.files[f"{ROOT}/pkg/new.py"] == "n = 0\n"
    with pytest.raises(EditorError, match="already exists"):
        await ed.run("create", "pkg/new.py", file_text="again")
    await ed.run("undo_edit", "pkg/new.py")
    assert f"{ROOT}/pkg/new.py" not in fs.files


async def test_missing_arguments_and_unknown_commands_are_clear() -> None:
    ed, _ = make()
    with pytest.raises(EditorError, match="'file_text' is required"):
        await ed.run("create", "b.py")
    with pytest.raises(EditorError, match="'old_str' is required"):
        await ed.run("str_replace", "a.py")
    with pytest.raises(EditorError, match="unknown command 'delete'"):
        await ed.run("delete", "a.py")
    with pytest.raises(EditorError, match="no such file"):
        await ed.run("view", "missing.py")
    with pytest.raises(EditorError, match=r"inside \.git"):
        await ed.run("create", ".git/hooks/pre-commit", file_text="x")
