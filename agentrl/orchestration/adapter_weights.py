"""What a LoRA run pushes to its servers (``trainer.lora.serve: adapter``): the adapter alone.

:class:`AdapterSnapshots` wraps the run's trainer (on a thread or in its own process) so
that the driver's ``state_dict_for_inference`` returns ``{role: adapter directory}``:
the trainer writes its adapter in peft format (``save_adapter``) into a new directory
under ``/dev/shm``, which :class:`~agentrl.inference.lora_sync.AdapterSync` links into a
directory of its own per version and hot-loads. Every other call goes to the trainer.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> class T:
    ...     def save_adapter(self, d):
    ...         Path(d).mkdir(parents=True)
    ...         return Path(d)
    >>> snaps = AdapterSnapshots(T(), shm_dir=tempfile.gettempdir())
    >>> sorted(snaps.state_dict_for_inference())
    ['policy']
    >>> snaps.close()
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import ComponentError
from agentrl.inference.adapters import DEFAULT_ROLE, served_lora_rank
from agentrl.inference.weight_sync import new_weights_dir, remove_weights_dir
from agentrl.trainer.config import TrainerConfig

__all__ = ["AdapterSnapshots", "served_rank", "serves_adapters"]

_KEPT = 2


def serves_adapters(trainer: TrainerConfig) -> bool:
    """Whether the servers serve the run's policy as a LoRA adapter."""
    return trainer.lora is not None and trainer.lora.serve == "adapter"


def served_rank(trainer: TrainerConfig) -> int | None:
    """The servers' ``--max-lora-rank`` for the run (None: no adapter serving)."""
    if not serves_adapters(trainer):
        return None
    assert trainer.lora is not None
    try:
        return served_lora_rank(trainer.lora.rank)
    except ValueError as e:
        raise ComponentError(str(e)) from None


class AdapterSnapshots:
    """The run's trainer, whose weights for the servers are its adapter (see the module).

    Args:
        trainer: Has ``save_adapter(out_dir)``.
        shm_dir: Where the snapshots go (default ``/dev/shm`` when it exists).
        roles: The roles of a ``trainer.lora.per_role`` run, whose ``save_adapter``
            writes one adapter per role into ``<out_dir>/<role>``; empty: one adapter,
            the ``policy`` role.
    """

    def __init__(
        self, trainer: Any, *, shm_dir: str | None = None, roles: Sequence[str] = ()
    ) -> None:
        self.trainer = trainer
        self.roles = tuple(roles)
        self._root = new_weights_dir("agentrl-adapter-snapshots-", shm_dir)
        self._snapshots: list[Path] = []
        self._n = 0

    def state_dict_for_inference(self) -> dict[str, Path]:
        """``{role: <peft adapter directory>}`` (``{"policy": …}`` without roles), freshly
        written (the last two kept)."""
        path = self._root / f"s{self._n}"
        self._n += 1
        self.trainer.save_adapter(path)
        self._snapshots.append(path)
        while len(self._snapshots) > _KEPT:
            shutil.rmtree(self._snapshots.pop(0), ignore_errors=True)
        if self.roles:
            return {role: path / role for role in self.roles}
        return {DEFAULT_ROLE: path}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.trainer, name)

    def close(self) -> None:
        """Removes the snapshots (idempotent); the trainer is closed by its owner."""
        remove_weights_dir(self._root)
