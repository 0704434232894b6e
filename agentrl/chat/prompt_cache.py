"""A bounded cache of prompt token ids, keyed by the messages they were rendered from.

A group's G episodes start from the same messages; rendering and encoding them was a
quarter of the rollout event loop's CPU in ``benchmarks/async_real.py``. The ids are
kept as a 4-byte ``array`` and the key as a 16-byte digest of the messages, so an entry
costs about 4 bytes a token: a list of Python ints cost ~36 (a soak's driver grew ~10
MiB filling 256 SWE prompts of ~1,100 tokens; 256 prompts of 32k tokens would have held
~300 MiB).

Example:
    >>> cache = PromptCache(max_entries=2)
    >>> cache.get("a") is None
    True
    >>> cache.put("a", [1, 2, 3])
    >>> cache.get("a")
    [1, 2, 3]
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["PromptCache"]


class PromptCache:
    """The last ``max_entries`` prompts' token ids (least recently used leaves first).

    Args:
        max_entries: How many prompts are remembered.
    """

    def __init__(self, max_entries: int = 256) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self.max_entries = max_entries
        self._ids: OrderedDict[bytes, array[int]] = OrderedDict()

    @staticmethod
    def _key(text: str) -> bytes:
        return hashlib.blake2b(text.encode(), digest_size=16).digest()

    def __len__(self) -> int:
        return len(self._ids)

    def get(self, key: str) -> list[int] | None:
        """The ids stored under ``key`` (a fresh list), or None."""
        k = self._key(key)
        ids = self._ids.get(k)
        if ids is None:
            return None
        self._ids.move_to_end(k)
        return ids.tolist()

    def put(self, key: str, ids: Sequence[int]) -> None:
        """Stores ``ids`` under ``key``; the least recently used entry leaves past the bound."""
        k = self._key(key)
        self._ids[k] = array("i", ids)  # 4 bytes: token ids are below 2**31
        self._ids.move_to_end(k)
        while len(self._ids) > self.max_entries:
            self._ids.popitem(last=False)

    def nbytes(self) -> int:
        """Bytes held by the stored ids."""
        return sum(a.itemsize * len(a) for a in self._ids.values())
