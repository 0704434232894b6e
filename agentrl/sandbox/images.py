"""Sandbox images: built locally from recipes under ``sandboxes/``, cached by recipe hash.

No registry is needed. ``sandboxes/base/rootfs.toml`` describes a Debian root filesystem
that ``debootstrap`` builds on the host and ``docker import`` turns into
``agentrl/base:<hash>``; every other folder ``sandboxes/NAME/`` holds a Dockerfile
(``ARG BASE`` / ``FROM ${BASE}``) layered on it as ``agentrl/NAME:<hash>``. The hash covers
the recipe's files (and the base's), so an image is rebuilt only when its recipe changes.

    python -m agentrl.sandbox.images build python [--force]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.errors import DockerUnavailableError

__all__ = [
    "ImageBuildError",
    "build_image",
    "docker_client",
    "ensure_image",
    "image_tag",
    "list_recipes",
    "sandboxes_dir",
]

BASE = "base"
REPOSITORY = "agentrl"
_LOG_TAIL_LINES = 25
_BUILD_NETWORK = os.environ.get("AGENTRL_BUILD_NETWORK", "host")


class ImageBuildError(RuntimeError):
    """An image failed to build; the message quotes the build log's tail."""


@functools.cache
def docker_client() -> Any:
    """The shared docker SDK client of the local engine (``DOCKER_HOST`` etc. honoured).

    Raises:
        RuntimeError: The SDK is missing or no engine answers, with how to start one.
    """
    try:
        import docker
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise DockerUnavailableError(
            "the `docker` Python package is missing: pip install docker"
        ) from e
    try:
        client = docker.from_env(timeout=120, max_pool_size=64)
        client.ping()
    except Exception as e:
        raise DockerUnavailableError(
            f"no Docker engine answers ({e}). Start one with `sudo bash scripts/setup-docker.sh` "
            "(installs docker.io and starts dockerd), or set DOCKER_HOST to a running engine."
        ) from e
    return client


def sandboxes_dir() -> Path:
    """The recipes folder: ``$AGENTRL_SANDBOXES_DIR`` or the repository's ``sandboxes/``."""
    env = os.environ.get("AGENTRL_SANDBOXES_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "sandboxes"


def list_recipes() -> list[str]:
    """Names of the image recipes (``base`` plus each folder with a Dockerfile)."""
    root = sandboxes_dir()
    names = [p.name for p in sorted(root.iterdir()) if (p / "Dockerfile").is_file()]
    return [BASE, *names]


def _recipe_dir(name: str) -> Path:
    path = sandboxes_dir() / name
    marker = "rootfs.toml" if name == BASE else "Dockerfile"
    if not (path / marker).is_file():
        raise ValueError(
            f"no image recipe {name!r}: {path / marker} is missing; known: {list_recipes()}"
        )
    return path


def _hash_dir(path: Path, h: Any) -> None:
    for f in sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(f.relative_to(path).as_posix().encode() + b"\0")
        h.update(f.read_bytes() + b"\0")


def image_tag(name: str) -> str:
    """The tag ``agentrl/NAME:<hash>`` the current recipe of ``name`` builds."""
    h = hashlib.sha256(name.encode() + b"\0")
    if name != BASE:
        h.update(image_tag(BASE).encode() + b"\0")
    _hash_dir(_recipe_dir(name), h)
    return f"{REPOSITORY}/{name}:{h.hexdigest()[:12]}"


def _exists(client: Any, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


@contextlib.contextmanager
def _build_lock(name: str) -> Iterator[None]:
    """One build of an image at a time on this machine (parallel test workers, runs)."""
    path = Path(tempfile.gettempdir()) / f"agentrl-image-{name}.lock"
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _tail(lines: list[str], n: int = _LOG_TAIL_LINES) -> str:
    text = "".join(lines).rstrip().splitlines()[-n:]
    return "\n".join("    " + line for line in text)


def _build_base(client: Any, tag: str) -> None:
    recipe = tomllib.loads((_recipe_dir(BASE) / "rootfs.toml").read_text())
    if shutil.which("debootstrap") is None:
        raise ImageBuildError(
            f"cannot build {tag}: debootstrap is missing (run scripts/setup-docker.sh as root, "
            "or apt-get install debootstrap)"
        )
    if os.geteuid() != 0:
        raise ImageBuildError(f"cannot build {tag}: debootstrap needs root (uid {os.geteuid()})")
    with tempfile.TemporaryDirectory(prefix="agentrl-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = ["debootstrap", f"--variant={recipe.get('variant', 'minbase')}"]
        if recipe.get("include"):
            cmd.append("--include=" + ",".join(recipe["include"]))
        cmd += [recipe.get("suite", "bookworm"), str(rootfs), recipe.get("mirror", "")]
        proc = subprocess.run(
            [c for c in cmd if c], capture_output=True, text=True, timeout=1800, check=False
        )
        if proc.returncode != 0:
            log = (proc.stdout + proc.stderr).splitlines(keepends=True)
            raise ImageBuildError(
                f"debootstrap for {tag} failed (exit {proc.returncode}); log tail:\n{_tail(log)}"
            )
        tarball = Path(tmp) / "rootfs.tar"
        subprocess.run(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."],
            check=True,
            capture_output=True,
            timeout=600,
        )
        repo, version = tag.split(":")
        client.api.import_image_from_file(str(tarball), repository=repo, tag=version)
    if not _exists(client, tag):
        raise ImageBuildError(f"docker import of {tag} produced no image")


def _build_layer(client: Any, name: str, tag: str, base_tag: str) -> None:
    log: list[str] = []
    error = None
    stream = client.api.build(
        path=str(_recipe_dir(name)),
        tag=tag,
        buildargs={"BASE": base_tag},
        network_mode=_BUILD_NETWORK,
        rm=True,
        forcerm=True,
        decode=True,
        labels={"agentrl.recipe": name},
    )
    for chunk in stream:
        if "stream" in chunk:
            log.append(chunk["stream"])
        if "error" in chunk:
            error = chunk["error"]
            log.append(str(chunk["error"]) + "\n")
    if error is not None or not _exists(client, tag):
        raise ImageBuildError(
            f"building image {tag} from {_recipe_dir(name)}/Dockerfile failed: "
            f"{str(error).strip()}\nbuild log tail:\n{_tail(log)}"
        )


def build_image(name: str, *, force: bool = False, client: Any = None) -> str:
    """Builds image ``name`` (and its base) unless its current recipe's tag exists.

    Args:
        name: A recipe under ``sandboxes/`` (``base``, ``python``, ...).
        force: Rebuild even if the tag exists (the base is rebuilt only if missing).
        client: A docker SDK client; the local engine by default.

    Returns:
        The image tag, ``agentrl/NAME:<hash>``.

    Raises:
        ImageBuildError: The build failed; the message quotes the build log's tail.
    """
    client = client or docker_client()
    tag = image_tag(name)
    with _build_lock(name):
        if not force and _exists(client, tag):
            return tag
        if name == BASE:
            _build_base(client, tag)
        else:
            base_tag = build_image(BASE, client=client)
            _build_layer(client, name, tag, base_tag)
        client.images.get(tag).tag(f"{REPOSITORY}/{name}", "latest")
    return tag


def ensure_image(name: str, *, client: Any = None) -> str:
    """The tag of image ``name``, building it first if its current recipe was never built."""
    return build_image(name, force=False, client=client)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.sandbox.images")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build an image from sandboxes/NAME")
    b.add_argument("name")
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    sub.add_parser("list", help="list recipes and their current tags")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            print(build_image(args.name, force=args.force))
        else:
            for name in list_recipes():
                print(f"{name:12s} {image_tag(name)}")
    except (ImageBuildError, RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
