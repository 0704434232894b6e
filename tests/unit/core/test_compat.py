"""Old module paths keep importing after the re-layout: the same module, with a warning."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import agentrl
from agentrl.compat import MOVED

PACKAGE = Path(agentrl.__file__).parent


def test_every_old_path_is_its_new_module_and_warns_once() -> None:
    # A fresh interpreter: nothing imported yet under either name.
    code = (
        "import importlib, warnings\n"
        "from agentrl.compat import MOVED\n"
        "for old, new in MOVED.items():\n"
        "    with warnings.catch_warnings(record=True) as seen:\n"
        "        warnings.simplefilter('always')\n"
        "        mod = importlib.import_module(old)\n"
        "    msgs = [str(w.message) for w in seen if w.category is DeprecationWarning]\n"
        "    assert any(m.startswith(f'{old} moved to {new};') for m in msgs), (old, msgs)\n"
        "    assert mod is importlib.import_module(new), old\n"
        "    assert mod.__spec__.name == new, (old, mod.__spec__.name)\n"
        "print(len(MOVED))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(len(MOVED))


def test_no_old_path_is_left_in_the_tree() -> None:
    for old in MOVED:
        rel = Path(*old.split(".")[1:])
        assert not (PACKAGE / rel).with_suffix(".py").exists(), old
        assert not (PACKAGE / rel).is_dir(), old


def test_a_submodule_of_a_moved_package_is_not_loaded_twice() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("agentrl.logging.run_dir")
    assert old is importlib.import_module("agentrl.reporting.run_dir")
