"""The runnable examples in the data layer's docstrings."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "tierec.data", "tierec.data.blocks", "tierec.data.columns", "tierec.data.errors", "tierec.data.hashing",
    "tierec.data.kernels", "tierec.data.loader", "tierec.data.parquet", "tierec.data.planted", "tierec.data.schema",
    "tierec.data.shards", "tierec.data.source", "tierec.data.synth_kernels", "tierec.data.synthetic", "tierec.data.text",
]  # fmt: skip


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
