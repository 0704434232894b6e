"""The repository inside a container: snapshot install, fresh git, diff, file access.

The snapshot lands in :data:`REPO_DIR`. For the agent, it becomes a new git repository
with one commit (no remotes, tags, reflog or earlier history); the agent's patch is the
``git diff`` of its work tree against that commit.
"""

from __future__ import annotations

import asyncio
import shlex
import tempfile
import uuid
from pathlib import Path
from typing import Literal, cast

from agentrl.sandbox.docker import WORKDIR, DockerSandbox

from .editor import EditorError
from .task import SweTask

__all__ = [
    "REPO_DIR",
    "SandboxFS",
    "SandboxLostError",
    "WorkspaceError",
    "git_diff",
    "init_git",
    "install_snapshot",
    "lost",
    "put_files",
]

REPO_DIR = f"{WORKDIR}/repo"
MAX_PATCH_BYTES = 2 << 20
_GIT = "git -c core.hooksPath=/dev/null -c core.quotepath=off -c core.fsmonitor=false"
_DATE = "2000-01-01T00:00:00+0000"


class WorkspaceError(RuntimeError):
    """Setting up the repository in a container failed (a broken task or image)."""


class SandboxLostError(RuntimeError):
    """A container of the episode, or the Docker engine, stopped answering mid-episode;
    the episode ends as an env error (discarded, not trained on), never as reward 0."""


def _engine_problem() -> str | None:
    """Why the Docker engine does not answer (a fresh client, 10 s), or None if it does."""
    try:
        import docker

        client = docker.from_env(timeout=10)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


async def lost(what: str, cause: BaseException | str) -> SandboxLostError:
    """The error ending an episode in which ``what`` (e.g. "the agent's container")
    failed with ``cause``, naming the Docker engine when it is what stopped answering."""
    engine = await asyncio.to_thread(_engine_problem)
    if engine is not None:
        return SandboxLostError(
            f"the Docker engine stopped answering ({engine}): {what} failed; the episode "
            "is discarded. Check that dockerd runs (DOCKER_HOST names the engine)"
        )
    return SandboxLostError(
        f"{what} failed ({cause}); the episode is discarded (the container was killed, "
        "ran out of memory, or its image is broken)"
    )


async def _sh(sb: DockerSandbox, script: str, what: str, timeout_s: float = 60.0) -> str:
    res = await sb.exec(["bash", "-c", "set -e\n" + script], timeout_s=timeout_s)
    if not res.ok:
        out = (res.stdout + res.stderr).strip()[-2000:]
        raise WorkspaceError(f"{what} failed (exit {res.exit_code}): {out}")
    return res.stdout


async def put_files(sb: DockerSandbox, files: dict[str, bytes], dest: str) -> None:
    """Copies ``files`` (relative path → bytes) into ``dest`` (under /workspace) at once."""
    with tempfile.TemporaryDirectory(prefix="agentrl-swe-") as tmp:
        for rel, data in files.items():
            path = Path(tmp) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        await sb.upload(tmp, dest)


async def install_snapshot(sb: DockerSandbox, task: SweTask) -> None:
    """Puts the task's snapshot (never its hidden tests) in :data:`REPO_DIR`, without .git."""
    await _sh(sb, f"mkdir -p {REPO_DIR}", f"task {task.id!r}: creating {REPO_DIR}")
    if task.image_repo_path is not None:
        src = shlex.quote(task.image_repo_path)
        cap_kib = sb.limits.max_disk_mb * 1024 // 2  # git's copy of it needs the other half
        await _sh(
            sb,
            f"test -d {src} || {{ echo 'no {task.image_repo_path} in the image'; exit 1; }}\n"
            f"kib=$(du -sk --exclude=.git {src} | cut -f1)\n"
            f'[ "$kib" -le {cap_kib} ] || {{ echo "the repository holds $((kib / 1024)) MiB, '
            f"over the {cap_kib // 1024} MiB a task may hold: half the container's disk "
            f'(limits.max_disk_mb={sb.limits.max_disk_mb})"; exit 1; }}\n'
            f"tar -C {src} --exclude=.git -cf - . | tar -C {REPO_DIR} -xf -",
            f"task {task.id!r}: copying the repository from {task.image_repo_path} in the image",
            timeout_s=300,
        )
    else:
        await put_files(sb, task.snapshot_files(), "repo")
    await _sh(
        sb,
        f"cd {REPO_DIR} && find . -name .git -prune -exec rm -rf {{}} +",
        f"task {task.id!r}: removing git metadata of the snapshot",
    )


async def init_git(sb: DockerSandbox) -> str:
    """Makes :data:`REPO_DIR` a fresh one-commit git repository; returns the commit id."""
    script = f"""cd {REPO_DIR}
{_GIT} init -q -b main .
printf '__pycache__/\\n*.pyc\\n.pytest_cache/\\n' >> .git/info/exclude
{_GIT} add -A
GIT_AUTHOR_DATE={_DATE} GIT_COMMITTER_DATE={_DATE} {_GIT} -c user.name=agentrl \\
  -c user.email=agentrl@localhost -c commit.gpgsign=false commit -q --no-verify \\
  --allow-empty -m 'Repository snapshot'
rm -rf .git/logs .git/hooks .git/COMMIT_EDITMSG .git/description
{_GIT} rev-parse HEAD"""
    return (await _sh(sb, script, "initializing git in the repository")).strip()


async def git_diff(sb: DockerSandbox, base: str) -> str:
    """The work tree's changes against commit ``base`` (new files included), as a git diff.

    Raises:
        WorkspaceError: git failed (e.g. the agent removed ``.git``) or the patch is too big.
    """
    out = f"{WORKDIR}/.agentrl-patch-{uuid.uuid4().hex}.diff"
    script = (
        f"cd {REPO_DIR}\n{_GIT} add -A\n"
        f"{_GIT} diff --cached --binary --no-color --no-ext-diff --no-textconv --no-renames "
        f"{shlex.quote(base)} > {out}"
    )
    await _sh(sb, script, "computing the agent's diff")
    try:
        data = await sb.read_file(out)
    except (ValueError, FileNotFoundError) as e:
        raise WorkspaceError(f"reading the agent's diff failed: {e}") from e
    if len(data) > MAX_PATCH_BYTES:
        raise WorkspaceError(f"the agent's diff has {len(data)} bytes (limit {MAX_PATCH_BYTES})")
    return data.decode("utf-8", errors="surrogateescape")


# A tiny helper run in the container as the sandbox user: op, path (argv).
_FS_SCRIPT = r"""
import os, sys
op, p = sys.argv[1], sys.argv[2]
if op == "kind":
    print("dir" if os.path.isdir(p) else "file" if os.path.exists(p) else "missing")
elif op == "delete":
    os.remove(p)
elif op == "list":
    depth = int(sys.argv[3])
    out = []
    for d, dirs, files in os.walk(p):
        rel = os.path.relpath(d, p)
        level = 0 if rel == "." else rel.count(os.sep) + 1
        dirs[:] = sorted(x for x in dirs if not x.startswith(".")) if level < depth else []
        for name in sorted(dirs + [f for f in files if not f.startswith(".")]):
            out.append(os.path.normpath(os.path.join(rel, name)))
    print("\n".join(sorted(out)))
"""


class SandboxFS:
    """The editor's :class:`~envs.swe.editor.FileSystem` inside a DockerSandbox."""

    def __init__(self, sandbox: DockerSandbox, *, timeout_s: float = 20.0) -> None:
        self.sandbox = sandbox
        self.timeout_s = timeout_s

    async def _op(self, *args: str, stdin: str | None = None) -> str:
        res = await self.sandbox.exec(
            ["python3", "-c", _FS_SCRIPT, *args], stdin=stdin, timeout_s=self.timeout_s
        )
        if not res.ok:
            raise EditorError(f"{args[0]} {args[1]} failed: {res.stderr.strip()[-500:]}")
        return res.stdout

    async def kind(self, path: str) -> Literal["file", "dir", "missing"]:
        out = (await self._op("kind", path)).strip()
        if out not in ("file", "dir", "missing"):
            raise EditorError(f"cannot tell what {path} is")
        return cast(Literal["file", "dir", "missing"], out)

    async def read_text(self, path: str) -> str:
        try:
            data = await self.sandbox.read_file(path)
        except (ValueError, FileNotFoundError) as e:
            raise EditorError(str(e)) from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise EditorError(f"{path} is not a UTF-8 text file") from None

    async def write_text(self, path: str, text: str) -> None:
        # As the sandbox user, through links only where it may go, only inside /workspace,
        # and only onto a regular file (DockerSandbox.write_file).
        try:
            await self.sandbox.write_file(path, text.encode("utf-8", errors="replace"))
        except (ValueError, FileNotFoundError) as e:
            raise EditorError(str(e)) from None

    async def delete(self, path: str) -> None:
        await self._op("delete", path)

    async def list_dir(self, path: str, depth: int) -> list[str]:
        return [x for x in (await self._op("list", path, str(depth))).splitlines() if x]
