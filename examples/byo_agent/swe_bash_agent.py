"""A bash-only coding agent (mini-swe-agent style) on the SWE env's tasks.

Each turn the model answers with a thought and exactly one ```bash block; the
agent runs it in the task's container and sends back the output. The episode
ends when the model runs ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (or the
step limit is reached); the repository's diff is then graded by the SWE env's
hidden tests in a fresh container, and that is the reward. No dependency
beyond ``openai`` and agentrl's Docker sandbox. Train it::

    agentrl train --agent examples/byo_agent/swe_bash_agent.py:solve --env swe \\
        rollout.max_total_tokens=8192

(``--env swe`` supplies the tasks and checks the Docker image at start-up.)
"""

from __future__ import annotations

import re
from typing import Any

import openai

from agentrl.envs.swe import Grader, builtin_tasks
from agentrl.envs.swe.loader import as_task
from agentrl.envs.swe.workspace import REPO_DIR, git_diff, init_git, install_snapshot
from agentrl.sandbox.base import SandboxLimits
from agentrl.sandbox.docker import DockerSandbox

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SYSTEM_PROMPT = f"""You are a software engineer fixing an issue in the Python repository at \
{REPO_DIR}. Reply with a short thought and exactly one bash code block:

```bash
<one command>
```

Each command runs in a fresh shell in {REPO_DIR}. Edit files with sed, cat <<'EOF' or python. \
When the fix is done, run `echo {SUBMIT}`; your changes are then graded by tests you cannot see."""
FORMAT_ERROR = "Please answer with exactly one ```bash block (one command)."
MAX_STEPS = 8
LIMITS = SandboxLimits(
    wall_timeout_s=30, cpu_time_s=60, memory_mb=512, max_processes=64,
    max_file_size_mb=16, max_disk_mb=128, max_output_bytes=64 << 10,
)  # fmt: skip
IMAGE: str | None = None  # None: agentrl/python (built by `agentrl sandbox build python`)
_BLOCK = re.compile(r"```bash\s*\n(.*?)```", re.S)


def _cut(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else f"{text[: limit // 2]}\n…\n{text[-limit // 2 :]}"


async def run(sb: DockerSandbox, command: str) -> str:
    """Runs one command in the repository; output, exit code and a timeout note."""
    res = await sb.exec(["bash", "-c", f"cd {REPO_DIR} || exit 1\nexec 2>&1\n{command}"])
    out = _cut(res.stdout + res.stderr)
    if res.timed_out:
        return f"{out}\n[killed: timed out]"
    return f"<returncode>{res.exit_code}</returncode>\n<output>\n{out}\n</output>"


async def solve(task: dict[str, Any], client: openai.AsyncOpenAI) -> float:
    """Runs the bash loop in the task's container; returns the hidden tests' verdict."""
    swe = as_task(task, builtin_tasks())
    sb = DockerSandbox(swe.image or IMAGE, LIMITS)
    await sb.start()
    try:
        await install_snapshot(sb, swe)
        base = await init_git(sb)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"<issue>\n{swe.issue.strip()}\n</issue>"},
        ]
        for _ in range(MAX_STEPS):
            resp = await client.chat.completions.create(model="policy", messages=messages)
            choice = resp.choices[0]
            text = choice.message.content or ""
            messages.append({"role": "assistant", "content": text})
            if choice.finish_reason == "length":
                break  # the context budget is spent
            blocks = _BLOCK.findall(text)
            if len(blocks) != 1:
                messages.append({"role": "user", "content": FORMAT_ERROR})
                continue
            if SUBMIT in blocks[0]:
                break
            messages.append({"role": "user", "content": await run(sb, blocks[0])})
        patch = await git_diff(sb, base)
    finally:
        await sb.close()
    return (await Grader(image=swe.image or IMAGE).grade(swe, patch)).reward
