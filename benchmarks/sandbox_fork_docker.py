"""DockerSandbox fork latency against a fresh sandbox, and the fork mechanisms, in one run.

A tree rollout branches an episode's container (``DockerSandbox.fork``). Times, ``--n``
samples each, p50 and p99 in ms, for a parent whose ``/workspace`` holds ``--files``
files of ``--kb`` KiB (plus a file in ``/tmp`` and ``/dev/shm``), each until the
sandbox has answered a first command (``true``), as an episode needs it to:

* fresh: ``DockerSandbox(image, limits).start()`` (what an independent episode pays);
* fork (tar through exec, the one chosen): ``await parent.fork()``: the child starts
  while ``tar`` archives the parent's files as the sandbox user, then ``tar`` unpacks
  them in the child;
* archive API: the child starts while the engine's ``get_archive`` reads ``/workspace``
  and ``/tmp`` of the parent, then ``put_archive`` writes them into the child
  (``/dev/shm`` it cannot write: a read-only root filesystem);
* commit: ``docker commit`` of the parent, a sandbox started from that image, the tar copy
  anyway (a commit holds no volume: ``/workspace`` would be empty), and the image's
  removal when the child closes (timed apart; images left are counted).

Prints each mechanism's p50/p99, the fork / fresh ratios and each candidate / the chosen
one at p50. Run: ``nice -n 10 python -m benchmarks.sandbox_fork_docker [--n 20]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from agentrl.sandbox.base import WORKDIR, SandboxLimits
from agentrl.sandbox.docker import DockerSandbox
from agentrl.sandbox.docker_fork import RESTORE, SNAPSHOT, _tar
from agentrl.sandbox.images import docker_client, ensure_image
from benchmarks.report import report
from benchmarks.stats import percentile

Make = Callable[[], Awaitable[DockerSandbox]]


async def timed(n: int, make: Make) -> list[float]:
    """Milliseconds until each of ``n`` sandboxes, with its files, has run a first command
    (``true``: a fresh one starts its resident exec server there, a fork in its unpack)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        sb = await make()
        assert (await sb.exec(["true"])).ok
        out.append((time.perf_counter() - t0) * 1e3)
        await sb.close()
    return out


def row(name: str, xs: list[float]) -> str:
    return f"{name:<44} p50 {percentile(xs, 50):8.1f} ms   p99 {percentile(xs, 99):8.1f} ms"


async def check(parent: DockerSandbox, child: DockerSandbox) -> None:
    """The child holds the parent's files (the mechanisms are timed doing the same job)."""
    cmd = f"cd {WORKDIR} && find . -type f | sort | xargs md5sum | md5sum"
    a, b = await parent.exec(cmd), await child.exec(cmd)
    assert a.ok and a.stdout == b.stdout, (a, b)


class Mechanisms:
    """The candidates, each making a started child with the parent's files."""

    def __init__(self, image: str, limits: SandboxLimits, parent: DockerSandbox) -> None:
        self.image, self.limits, self.parent = image, limits, parent
        self.client = docker_client()
        self.image_removal_ms: list[float] = []
        self.committed: list[str] = []

    async def fresh(self) -> DockerSandbox:
        sb = DockerSandbox(self.image, self.limits)
        await sb.start()
        return sb

    async def archive_api(self) -> DockerSandbox:
        api, pid = self.client.api, self.parent.container_id

        def get(path: str) -> bytes:
            stream, _ = api.get_archive(pid, path)
            return b"".join(stream)

        child = DockerSandbox(self.image, self.limits)
        paths = ("/workspace", "/tmp")
        got = await asyncio.gather(
            child.start(), *(asyncio.to_thread(get, f"{p}/.") for p in paths)
        )
        for path, data in zip(paths, got[1:], strict=True):
            assert await asyncio.to_thread(api.put_archive, child.container_id, path, data)
        return child

    async def commit(self) -> DockerSandbox:
        image = await asyncio.to_thread(self.parent._container.commit)
        self.committed.append(image.id)
        child = CommitChild(image.id, self.limits, self)
        archive, _ = await asyncio.gather(
            asyncio.to_thread(_tar, self.parent, SNAPSHOT, None, "archive"), child.start()
        )
        await asyncio.to_thread(_tar, child, RESTORE, archive, "unpack")
        return child


class CommitChild(DockerSandbox):
    """A sandbox from a committed image, which it removes when it closes."""

    def __init__(self, image: str, limits: SandboxLimits, owner: Mechanisms) -> None:
        super().__init__(image, limits)
        self._owner = owner

    async def close(self) -> None:
        await super().close()
        t0 = time.perf_counter()
        await asyncio.to_thread(self._owner.client.images.remove, str(self.image), force=True)
        self._owner.image_removal_ms.append((time.perf_counter() - t0) * 1e3)


async def main(n: int, files: int, kb: int) -> None:
    image = ensure_image("python")
    limits = SandboxLimits(memory_mb=256, max_disk_mb=max(64, 2 * files * kb // 1024 + 8))
    print(f"DockerSandbox fork vs fresh, {n} samples each, workspace {files} x {kb} KiB\n")
    async with DockerSandbox(image, limits) as parent:
        for i in range(files):
            await parent.write_file(f"d{i % 10}/f{i}.bin", bytes(kb * 1024))
        assert (await parent.exec("echo t > /tmp/t && echo s > /dev/shm/s")).ok
        m = Mechanisms(image, limits, parent)
        await (await m.fresh()).close()  # warm-up
        for make in (parent.fork, m.archive_api, m.commit):  # each gives the same files
            child = await make()
            await check(parent, child)
            await child.close()
        times: dict[str, list[float]] = {"fresh": [], "fork": [], "archive": [], "commit": []}
        for _ in range(n):  # interleaved: load on the shared machine hits all alike
            for name, make in (("fresh", m.fresh), ("fork", parent.fork),
                               ("archive", m.archive_api), ("commit", m.commit)):  # fmt: skip
                times[name] += await timed(1, make)
    ids = {i.id for i in docker_client().images.list(all=True)}
    images_left = len(ids & set(m.committed))
    print(row("fresh sandbox (start + first exec)", times["fresh"]))
    print(row("fork: tar through exec (chosen)", times["fork"]))
    print(row("archive API (get/put_archive)", times["archive"]))
    print(row("commit + run + tar copy", times["commit"]))
    print(row("  commit's image removal (at close)", m.image_removal_ms))
    print(f"images left by the commit mechanism: {images_left}\n")
    fresh, fork = times["fresh"], times["fork"]
    for q in (50, 99):
        ratio = percentile(fork, q) / percentile(fresh, q)
        print(f"fork / fresh at p{q}: {ratio:.2f}x")
        report(
            f"fork_vs_fresh_p{q}", ratio, unit="x", better="lower", baseline=percentile(fresh, q)
        )
    report("fork_p50_ms", percentile(fork, 50), unit="ms", better="lower")
    for name in ("archive", "commit"):
        ratio = percentile(times[name], 50) / percentile(fork, 50)
        print(f"{name} / fork at p50: {ratio:.2f}x")
        report(f"{name}_vs_fork_p50", ratio, unit="x", better="higher")
    report("commit_images_left", images_left, target=0, unit="", better="lower")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--kb", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.n, args.files, args.kb))
