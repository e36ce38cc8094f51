"""The runnable examples in the embedding engine's module docstrings."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "tierec.embedding.arena",
    "tierec.embedding.collection",
    "tierec.embedding.group",
    "tierec.embedding.hash_index",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
