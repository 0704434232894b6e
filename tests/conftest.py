"""Shared fixtures: the tiny model's tokenizer (built once per session)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from agentrl.models.tokenizer import build_tokenizer

    return build_tokenizer(seed=0)
