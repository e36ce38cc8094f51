"""Tiered storage of embedding rows: a bounded fast tier over host DRAM and disk.

>>> from tierec.store import TieredGroup, TierSpec
"""

from tierec.store.group import CacheCapacityError, StoreFullError, TieredGroup
from tierec.store.sizes import format_size, parse_size
from tierec.store.spec import CachePolicy, Counter, Tier, TierSpec

__all__ = [
    "CacheCapacityError",
    "CachePolicy",
    "Counter",
    "StoreFullError",
    "Tier",
    "TierSpec",
    "TieredGroup",
    "format_size",
    "parse_size",
]
