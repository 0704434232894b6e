"""The SWE-bench adapter end to end: a prebuilt image holding the repo (with git history)
at /testbed, validated and run like a SWE-bench instance."""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agentrl.envs.swe import Grader, SweEnv, from_swebench
from agentrl.envs.swe.validate import validate_task
from agentrl.sandbox.images import docker_client
from tests.integration import docker_fixtures
from tests.integration.docker_fixtures import LIMITS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
docker_image = docker_fixtures.docker_image

PATCH = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def double(x):
-    return x + 2
+    return x * 2
"""
TEST_PATCH = """diff --git a/test_calc.py b/test_calc.py
new file mode 100644
--- /dev/null
+++ b/test_calc.py
@@ -0,0 +1,5 @@
+from calc import double
+
+
+def test_double():
+    assert double(5) == 10
"""
DOCKERFILE = """ARG BASE
FROM ${BASE}
USER root
COPY calc.py /testbed/calc.py
RUN cd /testbed && git init -q && git add -A \\
 && git -c user.name=x -c user.email=x@x commit -qm base \\
 && echo "    return x * 2  # FUTURE-FIX" > future.txt && git add -A \\
 && git -c user.name=x -c user.email=x@x commit -qm FUTURE-FIX && git reset -q --hard HEAD~1
USER 1000:1000
"""


@pytest.fixture(scope="module")
def swebench_image(docker_image: str) -> Iterator[str]:
    client = docker_client()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, text in {
            "Dockerfile": DOCKERFILE,
            "calc.py": "def double(x):\n    return x + 2\n",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tf.addfile(info, io.BytesIO(text.encode()))
    tag = f"agentrl-test/swebench-mini:{uuid.uuid4().hex[:8]}"
    client.images.build(
        fileobj=io.BytesIO(buf.getvalue()), custom_context=True, tag=tag,
        buildargs={"BASE": docker_image}, network_mode="none", rm=True, forcerm=True,
    )  # fmt: skip
    try:
        yield tag
    finally:
        client.images.remove(tag, force=True)


def record(image: str) -> dict[str, Any]:
    return {
        "instance_id": "mini__calc-1",
        "repo": "mini/calc",
        "base_commit": "0" * 40,
        "patch": PATCH,
        "test_patch": TEST_PATCH,
        "problem_statement": "double(5) returns 7 instead of 10",
        "FAIL_TO_PASS": json.dumps(["test_calc.py::test_double"]),
        "PASS_TO_PASS": "[]",
        "image_name": image,
    }


async def test_swebench_record_validates_in_its_image(swebench_image: str) -> None:
    task = from_swebench(record(swebench_image), test_timeout_s=60)
    result = await validate_task(task, Grader(limits=LIMITS))
    assert result.ok, result.message()


async def test_agent_sees_the_repo_without_its_history(swebench_image: str) -> None:
    task = from_swebench(record(swebench_image), test_timeout_s=60)
    env = SweEnv(tasks=[task], limits=LIMITS, grader=Grader(limits=LIMITS))
    try:
        await env.reset({"id": task.id})
        out = await env.bash.call({"command": "ls -a; git log --all --reflog --format=%s"})
        assert "calc.py" in out and "test_calc.py" not in out
        assert out.split()[-2:] == ["Repository", "snapshot"]  # the one commit
        assert "FUTURE-FIX" not in out and "base" not in out
        await env.str_replace_editor.call(
            {"command": "str_replace", "path": "calc.py", "old_str": "x + 2", "new_str": "x * 2"}
        )
        assert (await env.grade()).reward == 1.0
    finally:
        await env.close()
