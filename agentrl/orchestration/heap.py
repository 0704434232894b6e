"""The start-up heap kept out of Python's cyclic garbage collector during a run.

A training process holds ~450k GC-tracked objects after start-up (torch, transformers,
the tokenizer, vLLM's client modules), nearly all of them alive to the end. Every
full (generation-2) collection walks them all: 0.2–0.55 s here, with the GIL held,
so the event loop and the trainer's thread stop together (one such pause was 4% of a
12-step fully_async run in ``benchmarks/async_real.py``). :func:`frozen_heap` collects
once and moves what survives to the permanent generation (``gc.freeze``, as vLLM's
server does after its own start-up); collections during the run then walk only what
the run created. On exit the objects go back to the oldest generation
(``gc.unfreeze``), so a long-lived caller (a notebook) collects them as before.

Example:
    >>> import gc
    >>> with frozen_heap():
    ...     gc.get_freeze_count() > 0
    True
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["frozen_heap"]


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Freezes the objects alive now for the duration of the block (not re-entrant:
    an inner block's exit unfreezes everything)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
