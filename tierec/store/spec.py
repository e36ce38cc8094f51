"""TierSpec: the resolved layout and policies of one tiered store (sizes in bytes).

Built from ``StoreConfig`` by :mod:`tierec.store.plan`; tests build it directly.

>>> from tierec.store.spec import TierSpec
>>> TierSpec(cache_bytes=1 << 20, host_bytes=0, disk_dir="/tmp").tiers()
['cache', 'disk']
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tierec.config import ColdPrecision, ConfigError, StrEnum


class Tier(StrEnum):
    CACHE = "cache"  # the fast tier: GPU memory on a GPU device, else a compact DRAM cache
    HOST = "host"  # host DRAM
    DISK = "disk"  # a file on local disk


class CachePolicy(StrEnum):
    LFU = "lfu"  # evict the lowest decayed access count
    LRU = "lru"  # evict the least recently used


class Counter(enum.IntEnum):
    """Per-table event counters of a tiered store."""

    HITS = 0  # unique rows of a lookup already in the fast tier
    MISSES = 1  # ... brought up from host or disk on demand
    NEW = 2  # ... inserted (admitted) by the lookup
    REJECTED = 3  # ... not admitted yet: read the shared zero row
    PREFETCHED = 4  # rows from disk whose records were read ahead (TieredGroup.stage)
    EVICTED = 5  # rows moved out of the fast tier
    DELETED_TTL = 6  # rows deleted after ttl_steps without use
    DELETED_LFU = 7  # rows deleted as least used over max_rows
    PROMOTED = 8  # rows moved up by the periodic hotness pass
    DISK_READ_ROWS = 9
    DISK_WRITE_ROWS = 10
    HOST_READ_ROWS = 11
    HOST_WRITE_ROWS = 12
    DEMOTED = 13  # host rows moved to disk to make room for hotter rows leaving the fast tier


@dataclass(frozen=True, kw_only=True)
class TierSpec:
    cache_bytes: int  # fast tier: bytes of rows (weights + optimizer state)
    host_bytes: int | None = None  # host tier: None = unbounded, 0 = no host tier
    disk_dir: str = ""  # directory of the disk tier's file; "" = no disk tier
    cache_policy: CachePolicy = CachePolicy.LFU
    interval: int = 100  # training steps between hotness passes (decay, deletion, placement)
    decay: float = 0.9  # access counts are multiplied by this at every pass
    promote_max: int = 0  # rows moved up per pass by hotness (0 = only on demand)
    admit_after: int = 0  # an unknown id gets a row at its K-th sighting (0 = at once)
    admit_probability: float = 1.0  # ... or with this probability per sighting
    max_rows: int = 0  # LFU deletion down to this many rows at every pass (0 = off)
    ttl_steps: int = 0  # delete rows unused for this many training steps (0 = off)
    sketch_width: int = 1 << 20  # count-min sketch of not-admitted ids: counters per row
    sketch_depth: int = 4
    io_threads: int = 8  # concurrent disk reads (io_engine "threads")
    io_engine: str = "auto"  # disk reads: "aio" (Linux native AIO), "threads" (blocking), auto: aio where offered
    drop_page_cache: bool = True  # drop the table file's pages after each I/O
    disk_segment_rows: int = 1 << 16  # records per disk segment (the unit of compaction)
    # compaction at each hotness pass keeps the disk file's segments in use at most this many slots per live
    # record: reads of a window's rows then span fewer dead bytes (benchmarks.tiers --which disk, 600 steps in:
    # the step's wait for them 7.5 ms at 1.25, 14.2 at 2.0, 18.6 with at most 4 segments a pass, as before)
    disk_max_ratio: float = 1.25
    cache_key: str = "store.cache_size"  # the setting cache_bytes comes from, as messages name it
    cold_precision: ColdPrecision = ColdPrecision.FP32  # rows in host and disk: fp32 | bf16 | int8 (store/codec.py)
    stage_bytes: int | None = None  # records read ahead (TieredGroup.stage) held at once; None = unbounded
    in_flight: int = 1  # lookups whose rows stay pinned; 2 lets the next batch's lookup run during a step
    horizon: int = 0  # training batches ahead whose ids rank eviction (tierec/store/horizon.py); 0 = none

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache_policy", CachePolicy.parse(self.cache_policy))
        object.__setattr__(self, "cold_precision", ColdPrecision.parse(self.cold_precision))
        if self.cache_bytes <= 0:
            raise ConfigError("the fast tier needs a positive size (store.cache_size)")
        if self.host_bytes == 0 and not self.disk_dir:
            raise ConfigError("a tiered store needs a host tier or a disk tier behind its cache")
        if self.interval < 1:
            raise ConfigError("store.interval must be >= 1")
        if not 0.0 < self.decay <= 1.0:
            raise ConfigError("store.decay must be in (0, 1]")
        if not 0.0 < self.admit_probability <= 1.0:
            raise ConfigError("store.admit_probability must be in (0, 1]")
        for k in ("promote_max", "admit_after", "max_rows", "ttl_steps", "horizon"):
            if getattr(self, k) < 0:
                raise ConfigError(f"store.{k} must be >= 0")
        if self.sketch_width & (self.sketch_width - 1) or self.sketch_width < 16:
            raise ConfigError("store.sketch_width must be a power of two >= 16")
        if self.in_flight not in (1, 2):
            raise ConfigError("a tiered store keeps the rows of 1 or 2 lookups pinned")
        if self.sketch_depth < 1 or self.io_threads < 1 or self.disk_segment_rows < 1:
            raise ConfigError("store.sketch_depth, io_threads and disk_segment_rows must be >= 1")

    @property
    def admission(self) -> bool:
        return self.admit_after > 1 or self.admit_probability < 1.0

    def tiers(self) -> list[str]:
        out = [Tier.CACHE.value]
        if self.host_bytes != 0:
            out.append(Tier.HOST.value)
        if self.disk_dir:
            out.append(Tier.DISK.value)
        return out
