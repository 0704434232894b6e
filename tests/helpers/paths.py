"""Paths of the checkout the tests read: the repository root and the test data."""

from __future__ import annotations

from pathlib import Path

#: The repository root (where pyproject.toml, examples/ and configs/ are).
REPO = Path(__file__).resolve().parents[2]
#: tests/data: chat templates of published families and their tokenizers.
DATA = REPO / "tests" / "data"
