"""LoRA adapters served by vLLM: their names, which one each server serves per role, and
how many requests use each.

A served adapter is named ``<role>-v<version>`` (``policy-v3``) and loaded from a
directory of its own: a name or path is never reused for new weights, since vLLM keys
its prefix cache by both and would serve blocks computed with the old weights. The
:class:`AdapterTable` is shared by the :class:`~agentrl.inference.router.Router` (a
request takes the current adapter of its role on the server it goes to, and its tokens
carry that adapter's version) and the
:class:`~agentrl.inference.lora_sync.AdapterSync` (which loads new versions and unloads
old ones once no request in flight uses them).

Example:
    >>> from pathlib import Path
    >>> t = AdapterTable()
    >>> t.set_current("http://s1", Adapter("policy", 1, Path("/dev/shm/x/policy-v1")))
    >>> a = t.acquire("http://s1", "policy")
    >>> (a.name, a.version)
    ('policy-v1', 1)
    >>> t.set_current("http://s1", Adapter("policy", 2, Path("/dev/shm/x/policy-v2")))
    >>> [x.name for x in t.idle("http://s1")]  # v1 is still used by a request
    []
    >>> t.release("http://s1", a)
    >>> [x.name for x in t.idle("http://s1")]
    ['policy-v1']
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_ROLE",
    "VLLM_LORA_RANKS",
    "Adapter",
    "AdapterTable",
    "adapter_name",
    "served_lora_rank",
]

DEFAULT_ROLE = "policy"
"""The role of a request that names none (one policy for every turn)."""

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM 0.32's allowed ``--max-lora-rank`` values; used only when vLLM is not importable."""


def adapter_name(role: str, version: int) -> str:
    """The served name of ``role``'s adapter at ``version``: ``<role>-v<version>``."""
    return f"{role}-v{version}"


def served_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM allows that is at least ``rank``.

    The allowed set is read from vLLM's ``LoRAConfig`` (its ``max_lora_rank`` type).

    Raises:
        ValueError: ``rank`` is above the largest rank vLLM serves.
    """
    allowed: tuple[int, ...] = VLLM_LORA_RANKS
    try:
        from typing import get_args

        from vllm.config.lora import MaxLoRARanks

        allowed = tuple(sorted(int(r) for r in get_args(MaxLoRARanks)))
    except (ImportError, AttributeError):  # attached servers only: no local vLLM
        pass
    for r in sorted(allowed):
        if r >= rank:
            return r
    raise ValueError(
        f"trainer.lora.rank={rank} is above the largest LoRA rank vLLM serves "
        f"({max(allowed)}); lower trainer.lora.rank or set trainer.lora.serve: merged"
    )


@dataclass(frozen=True)
class Adapter:
    """One adapter version as the servers know it.

    Attributes:
        role: Whose adapter (``policy``; one per role with per-role adapters).
        version: Its weight version: the label of every token sampled with it.
        path: The directory vLLM loaded it from (peft format).
    """

    role: str
    version: int
    path: Path

    @property
    def name(self) -> str:
        """The name requests send as their ``model``."""
        return adapter_name(self.role, self.version)


class AdapterTable:
    """Which adapter each server serves per role, and the requests in flight on each.

    Args:
        on_idle: Called with (server URL, adapter) when an adapter that is no longer
            current on a server has no request in flight there (the sync unloads it).
    """

    def __init__(self, on_idle: Callable[[str, Adapter], None] | None = None) -> None:
        self.on_idle = on_idle
        self._current: dict[str, dict[str, Adapter]] = {}
        self._loaded: dict[str, dict[str, Adapter]] = {}
        self._in_flight: Counter[tuple[str, str]] = Counter()

    def current(self, url: str, role: str = DEFAULT_ROLE) -> Adapter | None:
        """The adapter new requests of ``role`` use on ``url`` (None: the base model)."""
        return self._current.get(url, {}).get(role)

    def loaded(self, url: str) -> list[Adapter]:
        """The adapters ``url`` holds (as far as this table knows)."""
        return list(self._loaded.get(url, {}).values())

    def in_flight(self, url: str, name: str) -> int:
        """Requests in flight on ``url`` with the adapter ``name``."""
        return self._in_flight[(url, name)]

    def acquire(self, url: str, role: str = DEFAULT_ROLE) -> Adapter | None:
        """The current adapter of ``role`` on ``url``, counted in flight until
        :meth:`release` (None: no adapter yet, the request goes to the base model)."""
        a = self.current(url, role)
        if a is not None:
            self._in_flight[(url, a.name)] += 1
        return a

    def release(self, url: str, adapter: Adapter | None) -> None:
        """The request that :meth:`acquire` d ``adapter`` on ``url`` has ended."""
        if adapter is None:
            return
        key = (url, adapter.name)
        self._in_flight[key] -= 1
        if self._in_flight[key] <= 0:
            del self._in_flight[key]
            if self._is_idle(url, adapter):
                self._idle(url, adapter)

    def set_current(self, url: str, adapter: Adapter) -> None:
        """``url`` has loaded ``adapter``; new requests of its role use it from now on."""
        self._loaded.setdefault(url, {})[adapter.name] = adapter
        old = self._current.setdefault(url, {}).get(adapter.role)
        self._current[url][adapter.role] = adapter
        if old is not None and old.name != adapter.name and self._is_idle(url, old):
            self._idle(url, old)

    def forget(self, url: str, name: str) -> None:
        """``url`` no longer holds the adapter ``name`` (it was unloaded)."""
        self._loaded.get(url, {}).pop(name, None)

    def reset(self, url: str) -> None:
        """``url`` was restarted: it holds no adapter; its requests use the base model
        until it loads the current ones."""
        self._loaded.pop(url, None)
        self._current.pop(url, None)

    def idle(self, url: str) -> list[Adapter]:
        """Adapters ``url`` holds that are neither current nor used by a request."""
        return [a for a in self.loaded(url) if self._is_idle(url, a)]

    def in_use(self, adapter: Adapter) -> bool:
        """Whether any server still holds ``adapter`` (its directory must stay)."""
        return any(adapter.name in held for held in self._loaded.values())

    def _is_idle(self, url: str, a: Adapter) -> bool:
        cur = self.current(url, a.role)
        return (
            (cur is None or cur.name != a.name)
            and a.name in self._loaded.get(url, {})
            and self._in_flight[(url, a.name)] == 0
        )

    def _idle(self, url: str, a: Adapter) -> None:
        if self.on_idle is not None:
            self.on_idle(url, a)
