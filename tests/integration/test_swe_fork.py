"""A SWE episode forked mid-episode on real Docker: the branches' files diverge, the
parent's do not, each branch is graded on its own diff, and nothing is left behind."""

from __future__ import annotations

import pytest

from agentrl.envs.swe import Grader, SweEnv
from agentrl.envs.swe.workspace import REPO_DIR
from agentrl.sandbox.docker import RUN_ID
from agentrl.sandbox.docker_fork import FORK_LABEL
from agentrl.sandbox.images import docker_client
from tests.integration import docker_fixtures
from tests.integration.docker_fixtures import LIMITS
from tests.integration.test_swe_env import FIX, TASK_ID

docker_image = docker_fixtures.docker_image  # the session fixture, under its own name

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _owned() -> tuple[set[str], set[str], set[str]]:
    """Ids of this process's sandbox containers, volumes and images (by the run label)."""
    client = docker_client()
    filters = {"label": [f"agentrl.run={RUN_ID}"]}
    return (
        {c.id for c in client.containers.list(all=True, filters=filters)},
        {v.name for v in client.volumes.list(filters=filters)},
        {i.id for i in client.images.list(filters=filters)},
    )


async def _files(env: SweEnv) -> str:
    assert env.sandbox is not None
    r = await env.sandbox.exec(f"cd {REPO_DIR} && cat pager.py && ls && git status --short")
    assert r.ok, r
    return r.stdout


async def test_forked_episode_branches_diverge_and_are_graded_apart(docker_image: str) -> None:
    before = _owned()
    grader = Grader(image=docker_image, limits=LIMITS)
    env = SweEnv(image=docker_image, limits=LIMITS, grader=grader)
    branches: list[SweEnv] = []
    try:
        await env.reset({"id": TASK_ID})
        await env.str_replace_editor("create", "notes.md", file_text="parent's edit\n")
        parent_files = await _files(env)
        branches = [await env.fork(), await env.fork()]
        a, b = branches
        assert await _files(a) == await _files(b) == parent_files  # the edit was copied
        # Each branch edits differently: a fixes the bug; b undoes the parent's edit (the
        # editor's history was copied) and breaks another line with bash.
        assert "has been edited" in await a.str_replace_editor(**FIX)  # type: ignore[arg-type]
        assert "undone" in (await b.str_replace_editor("undo_edit", "notes.md")).lower()
        await b.bash("sed -i 's/per_page/per_page_/' pager.py")
        files_a, files_b = await _files(a), await _files(b)
        assert "(page - 1) * per_page" in files_a and "notes.md" in files_a
        assert "per_page_" in files_b and "notes.md" not in files_b
        assert await _files(env) == parent_files  # the parent's files did not move
        # Each leaf is graded on its own files.
        assert (await a.grade()).reward == 1.0 and (await b.grade()).reward == 0.0
        assert "(page - 1)" in a.last_patch and "(page - 1)" not in b.last_patch
        assert env.last_patch == "" and env.last_grade is None
        ids = [x.sandbox.container_id for x in (env, a, b) if x.sandbox is not None]
        labels = [docker_client().containers.get(i).labels for i in ids]
        assert labels[1][FORK_LABEL] == labels[2][FORK_LABEL] == ids[0]
    finally:
        for e in (*branches, env):
            await e.close()
    after = _owned()
    assert all(now <= then for now, then in zip(after, before, strict=True)), (before, after)
