"""The runnable examples in the store's module docstrings."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "tierec.store",
    "tierec.store.sizes",
    "tierec.store.spec",
    "tierec.store.directory",
    "tierec.store.host",
    "tierec.store.disk",
    "tierec.store.hotness",
    "tierec.store.group",
    "tierec.store.plan",
    "tierec.store.pipeline",
    "tierec.store.monitor",
    "benchmarks.tiers_sim",
    "benchmarks.tiers_memory",
    "benchmarks.tiers",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
