"""Console output of a run: full-width step lines when piped, a progress bar on a terminal."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import textwrap
from pathlib import Path

from rich.console import Console

from agentrl.reporting.progress import ProgressLog

METRICS = {
    "reward/mean": 0.5,
    "reward/zero_std_group_frac": 0.25,
    "actor/entropy": 1.25,
    "kl/ref_kl": 0.0012,
    "actor/grad_norm": 3.5,
    "response/length_mean": 120.0,
    "perf/tokens_per_s": 1234.0,
}


def test_piped_output_is_one_full_line_per_step_however_narrow(tmp_path: Path) -> None:
    out = io.StringIO()
    console = Console(file=out, width=40, force_terminal=False)
    log = ProgressLog(10, tmp_path, wandb_mode="disabled", console=console)
    log.step(1, METRICS)
    log.step(2, METRICS)
    log.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and all(len(line) > 40 for line in lines)
    assert lines[1].startswith("step 2/10 | reward 0.500 | 0-std groups 0.25 | entropy 1.250")
    assert lines[1].endswith(" min") and "1234 tok/s" in lines[1]


def test_terminal_output_has_a_progress_bar(tmp_path: Path) -> None:
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=True, color_system=None)
    log = ProgressLog(10, tmp_path, wandb_mode="disabled", console=console)
    log.step(3, METRICS)
    log.close()
    log.close()  # idempotent
    text = out.getvalue()
    assert "━" in text and "3/10" in text  # the bar, step of total
    assert "step 3/10 | reward 0.500" in text  # the step line stays above it


SCRIPT = textwrap.dedent(
    """
    import sys, tempfile
    from pathlib import Path
    from agentrl.reporting.progress import ProgressLog
    log = ProgressLog(4, Path(tempfile.mkdtemp()), wandb_mode="disabled")
    for s in (1, 2):
        log.step(s, {"reward/mean": 0.5, "actor/entropy": 1.25, "perf/tokens_per_s": 99.0,
                     "response/length_mean": 1000.0, "kl/ref_kl": 0.001})
    log.close()
    """
)


def test_a_real_pipe_gets_unwrapped_lines() -> None:
    env = {**os.environ, "COLUMNS": "30", "TERM": "xterm"}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                       timeout=120, check=True)  # fmt: skip
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("step 1/4 | reward 0.500 | entropy")
    assert "━" not in r.stdout and "\x1b[" not in r.stdout


def test_a_real_terminal_gets_the_bar() -> None:
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    p = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=follower, stderr=follower,
                         env=env)  # fmt: skip
    os.close(follower)
    out = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert p.wait(30) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))  # no colours
    assert "━" in text and "2/4" in text and "step 2/4" in text
