"""Deprecation shims: old module paths that moved keep importing, with a DeprecationWarning.

``import agentrl.env_registry`` (moved to ``agentrl.loading.envs``) still works: the finder
installed by ``agentrl/__init__.py`` answers the old name with the module at its new path
(the same module object, so monkeypatching either name patches both) and warns once.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True):
    ...     warnings.simplefilter("always")
    ...     import agentrl.gym_adapter as old
    >>> import agentrl.adapters.gym as new
    >>> old is new
    True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

#: Old module path -> new module path (the re-layout of 0.2; removed in 0.4).
MOVED: dict[str, str] = {
    "agentrl.cli_errors": "agentrl.cli.errors",
    "agentrl.cli_model": "agentrl.cli.model",
    "agentrl.orchestration.ray_config": "agentrl.config.ray",
    "agentrl.env_registry": "agentrl.loading.envs",
    "agentrl.user_modules": "agentrl.loading.modules",
    "agentrl.data": "agentrl.loading.task_files",
    "agentrl.gym_adapter": "agentrl.adapters.gym",
    "agentrl.cpus": "agentrl.runtime.cpus",
    "agentrl.lifecycle": "agentrl.runtime.lifecycle",
    "agentrl.watchdog": "agentrl.runtime.watchdog",
    "agentrl.llm": "agentrl.inference.protocol",
    "agentrl.logging": "agentrl.reporting",
    "agentrl.logging.dashboard": "agentrl.reporting.dashboard",
    "agentrl.logging.doctor": "agentrl.reporting.doctor",
    "agentrl.logging.early_stop": "agentrl.reporting.early_stop",
    "agentrl.logging.progress": "agentrl.reporting.progress",
    "agentrl.logging.quiet": "agentrl.reporting.quiet",
    "agentrl.logging.run_dir": "agentrl.reporting.run_dir",
    "agentrl.rollout.templates": "agentrl.chat.templates",
    "agentrl.rollout.template_text": "agentrl.chat.template_text",
    "agentrl.rollout.tokenization": "agentrl.chat.tokenization",
    "agentrl.rollout.consistency": "agentrl.chat.consistency",
    "agentrl.tools.parsers": "agentrl.chat.parsers",
    "agentrl.tools.harmony": "agentrl.chat.harmony",
    "agentrl.tools.vllm_parsers": "agentrl.chat.vllm_parsers",
    "agentrl.tools.reasoning": "agentrl.chat.reasoning",
    "agentrl.tools.detect": "agentrl.chat.detect",
    "agentrl.trainer.advantages": "agentrl.trainer.algo.advantages",
    "agentrl.trainer.losses": "agentrl.trainer.algo.losses",
    "agentrl.trainer.correction": "agentrl.trainer.algo.correction",
    "agentrl.trainer.kl": "agentrl.trainer.algo.kl",
    "agentrl.trainer.shaping": "agentrl.trainer.algo.shaping",
    "agentrl.trainer.trainer": "agentrl.trainer.engine.trainer",
    "agentrl.trainer.actor": "agentrl.trainer.engine.actor",
    "agentrl.trainer.networks": "agentrl.trainer.engine.networks",
    "agentrl.trainer.distributed": "agentrl.trainer.engine.distributed",
    "agentrl.trainer.update": "agentrl.trainer.engine.update",
    "agentrl.trainer.state": "agentrl.trainer.engine.state",
    "agentrl.trainer.batch": "agentrl.trainer.engine.batch",
    "agentrl.trainer.memory": "agentrl.trainer.engine.memory",
    "agentrl.trainer.sysmem": "agentrl.trainer.engine.sysmem",
    "agentrl.trainer.metrics": "agentrl.trainer.engine.metrics",
    "agentrl.trainer.checkpoint": "agentrl.trainer.engine.checkpoint",
    "agentrl.trainer.dpo": "agentrl.trainer.objectives.dpo",
    "agentrl.trainer.preference": "agentrl.trainer.objectives.preference",
    "agentrl.trainer.pairs_file": "agentrl.trainer.objectives.pairs_file",
    "agentrl.trainer.rft": "agentrl.trainer.objectives.rft",
    "agentrl.orchestration.ray_actors": "agentrl.orchestration.placement.actors",
    "agentrl.orchestration.ray_adapters": "agentrl.orchestration.placement.adapters",
    "agentrl.orchestration.ray_cluster": "agentrl.orchestration.placement.cluster",
    "agentrl.orchestration.ray_train": "agentrl.orchestration.placement.train",
    "agentrl.orchestration.sft": "agentrl.orchestration.rft",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; import it from there "
            f"(the old path is removed in agentrl 0.4)",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module ran under its new name; give it back the spec the import machinery
        # just overwrote with the old name's.
        module.__spec__ = self._spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


_FINDER = _MovedFinder()


def install() -> None:
    """Lets the old module paths of :data:`MOVED` import (idempotent)."""
    if _FINDER not in sys.meta_path:
        # First: a moved package's submodule would otherwise load a second time, under its
        # old name, from the new folder.
        sys.meta_path.insert(0, _FINDER)
