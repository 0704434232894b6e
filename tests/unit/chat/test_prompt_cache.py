"""The prompt cache: bounded, least recently used out first, 4 bytes a token."""

from __future__ import annotations

import sys

import pytest

from agentrl.chat.prompt_cache import PromptCache


def test_the_least_recently_used_prompt_leaves_first() -> None:
    cache = PromptCache(max_entries=2)
    cache.put("a", [1, 2])
    cache.put("b", [3])
    assert cache.get("a") == [1, 2]  # a is now the most recent
    cache.put("c", [4, 5, 6])
    assert cache.get("b") is None
    assert (cache.get("a"), cache.get("c"), len(cache)) == ([1, 2], [4, 5, 6], 2)


def test_a_caller_gets_its_own_list_and_large_ids_survive() -> None:
    cache = PromptCache()
    ids = [0, 151_643, 2**31 - 1]
    cache.put("k", ids)
    got = cache.get("k")
    assert got == ids
    assert got is not None
    got.append(7)
    assert cache.get("k") == ids


def test_an_entry_costs_four_bytes_a_token_not_a_python_list() -> None:
    cache = PromptCache()
    ids = list(range(100_000, 110_000))  # 10,000 ids past the small-int cache
    key = repr(["a long prompt " * 200])
    cache.put(key, ids)
    assert cache.nbytes() == 40_000
    # What the cache held before: the list and its ints (~36 bytes a token) and the key.
    as_list = sys.getsizeof(ids) + sum(sys.getsizeof(i) for i in ids)
    assert as_list > 8 * cache.nbytes()


def test_a_cache_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        PromptCache(max_entries=0)
