"""Sandbox forks: LocalSandbox.fork copies the files, then parent and child diverge; a
sandbox without fork() is refused by name."""

from __future__ import annotations

import copy

import pytest

from agentrl.sandbox import (
    ExecResult,
    ForkableSandbox,
    LocalSandbox,
    Sandbox,
    SandboxError,
    fork_sandbox,
)
from tests.helpers.sandbox import LIMITS, namespaces_work

needs_namespaces = pytest.mark.skipif(
    not namespaces_work(), reason="LocalSandbox needs root, util-linux unshare and namespaces"
)

SETUP = (
    "mkdir -p src/pkg && printf 'v1' > src/pkg/a.txt && printf '#!/bin/sh\\necho run' > tool.sh"
    " && chmod 755 tool.sh && ln -s src/pkg/a.txt link && ln -s /etc/hostname out"
    " && echo tmp > /tmp/t.txt && mkfifo pipe && touch -d '2001-02-03 04:05:06' src/pkg/a.txt"
)
SHOW = (
    "cat src/pkg/a.txt; echo; ./tool.sh; cat link; echo; readlink out; cat /tmp/t.txt;"
    " stat -c '%u %a %Y' src/pkg/a.txt tool.sh; ls pipe 2>&1 | grep -c 'No such'"
)


@needs_namespaces
async def test_child_starts_from_the_parents_files_then_they_diverge() -> None:
    async with LocalSandbox(LIMITS) as parent:
        assert (await parent.exec(SETUP)).ok
        await parent.write_file("bin.dat", bytes(range(256)))
        tool_mtime = (await parent.exec("stat -c %Y tool.sh")).stdout.strip()
        child = await fork_sandbox(parent)
        async with child:
            assert isinstance(child, LocalSandbox) and child.uid != parent.uid
            r = await child.exec(SHOW)
            mtime = "981173106"  # 2001-02-03 04:05:06 UTC
            assert r.ok, r
            assert r.stdout.split("\n") == [
                "v1", "run", "v1", "/etc/hostname", "tmp",
                f"{child.uid} 644 {mtime}", f"{child.uid} 755 {tool_mtime}",
                "1", "",
            ]  # fmt: skip
            assert await child.read_file("bin.dat") == bytes(range(256))
            # the child's writes stay in the child ...
            await child.write_file("src/pkg/a.txt", "child")
            assert (await child.exec("rm tool.sh && echo new > only_child")).ok
            assert await parent.read_file("src/pkg/a.txt") == b"v1"
            listing = (await parent.exec("ls")).stdout.split()
            assert listing == ["bin.dat", "link", "out", "pipe", "src", "tool.sh"]
            # ... and the parent's in the parent
            await parent.write_file("src/pkg/a.txt", "parent")
            assert (await parent.exec("echo p > /tmp/t.txt")).ok
            assert await child.read_file("src/pkg/a.txt") == b"child"
            assert (await child.exec("cat /tmp/t.txt")).stdout == "tmp\n"
            # the link out of the workdir was copied as a link, not followed
            assert (await child.exec("test -L out && cat out")).stdout == "sandbox\n"
        assert not child.alive and parent.alive  # closing the child leaves the parent
        assert (await parent.exec("cat src/pkg/a.txt")).stdout == "parent"


@needs_namespaces
async def test_fork_of_a_fork_and_of_a_closed_sandbox() -> None:
    parent = LocalSandbox(LIMITS)
    async with parent:
        await parent.write_file("x", "1")
        async with await parent.fork() as child, await child.fork() as grandchild:
            await child.write_file("x", "2")
            assert await grandchild.read_file("x") == b"1"
    with pytest.raises(SandboxError, match="cannot fork a closed sandbox"):
        await parent.fork()


class NoFork:
    """A sandbox double without fork()."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> NoFork:
        return self

    async def __aexit__(self, *exc: object) -> None: ...

    async def exec(self, cmd, *, timeout_s=None, stdin=None, env=None) -> ExecResult:
        return ExecResult("", "", 0)

    async def run_code(self, code, *, language="python", timeout_s=None) -> ExecResult:
        return ExecResult("", "", 0)

    async def write_file(self, path, data) -> None: ...

    async def read_file(self, path) -> bytes:
        return b""


async def test_a_sandbox_without_fork_is_refused_by_name() -> None:
    sb = NoFork()
    assert isinstance(sb, Sandbox) and not isinstance(sb, ForkableSandbox)
    with pytest.raises(SandboxError, match=r"^NoFork cannot fork: it defines no fork\(\)"):
        await fork_sandbox(sb)
    assert isinstance(LocalSandbox(LIMITS), ForkableSandbox)


def test_a_local_sandbox_refuses_deepcopy() -> None:
    # An env's default fork deep-copies its state: it must not alias a live sandbox.
    with pytest.raises(TypeError, match=r"live process.*sandbox\.fork\(\)"):
        copy.deepcopy({"sb": LocalSandbox(LIMITS)})
