"""Tiered storage of embedding rows: a bounded fast tier over host DRAM and disk.

The heavy parts (torch, numba) load on first use, so ``tierec.config`` can
validate sizes with :func:`parse_size` without importing them.

>>> from tierec.store import TieredGroup, TierSpec, parse_size
"""

from __future__ import annotations

import importlib
from typing import Any

from tierec.sizes import format_size, parse_size

_LAZY = {
    "CacheCapacityError": "tierec.store.group",
    "StoreFullError": "tierec.store.group",
    "TieredGroup": "tierec.store.tiered_group",
    "CachePolicy": "tierec.store.spec",
    "Counter": "tierec.store.spec",
    "Tier": "tierec.store.spec",
    "TierSpec": "tierec.store.spec",
    "StorePlan": "tierec.store.plan",
    "StoreMonitor": "tierec.store.monitor",
    "StorePipeline": "tierec.store.pipeline",
    "RowCodec": "tierec.store.codec",
    "row_codec": "tierec.store.codec",
}

__all__ = ["format_size", "parse_size", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tierec.store' has no attribute {name!r}")
