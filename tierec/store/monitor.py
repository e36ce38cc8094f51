"""StoreMonitor: what the trainer sees of the tiered stores.

It wraps the batch stream in the prefetch pipeline (``store.prefetch``),
gives short progress-bar fields (fast-tier hit rate, disk traffic, compute
wait) and full records for the metrics file: per table and tier the hit rate,
rows resident, rows admitted, evicted and deleted, bytes read from and written
to disk; and the pipeline's wait times. With no tiered group it does nothing.

>>> from tierec.config import load_config
>>> from tierec.train.components import Components
>>> from tierec.store.monitor import StoreMonitor
>>> parts = Components.build(load_config(None, ["embedding.dim=4"]), ["C1"], n_dense=1)
>>> m = StoreMonitor([parts.embeddings], load_config(None).store)
>>> m.active, m.postfix(), list(m.wrap(iter([1, 2])))
(False, {}, [1, 2])
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from tierec.config import StoreConfig
from tierec.store.pipeline import StorePipeline
from tierec.sizes import format_size
from tierec.store.spec import Counter

_SUMMED = (
    "hits",
    "misses",
    "new",
    "rejected",
    "prefetched",
    "evicted",
    "deleted_ttl",
    "deleted_lfu",
    "promoted",
    "disk_read_rows",
    "disk_write_rows",
    "host_read_rows",
    "host_write_rows",
    "demoted",
    "rows_cache",
    "rows_host",
    "rows_disk",
    "disk_read_bytes",
    "disk_write_bytes",
)


class StoreMonitor:
    def __init__(self, collections: list[Any], cfg: StoreConfig) -> None:
        self.collections = [c for c in collections if c is not None]
        # the tiered stores behind every storage (a tiered group, the chunk store of a tiered pruned group)
        self.groups = [s for c in self.collections for g in c.groups for s in g.tier_stores()]
        self.active = bool(self.groups)
        # a store rounds its cold rows (store.cold_precision): its numbers differ from the same run in memory anyway
        self.lossy = any(g.codec.lossy for g in self.groups)
        depth = cfg.prefetch_depth if cfg.prefetch else 0
        horizon = cfg.horizon if any(g.horizon.length for g in self.groups) else 0  # stores with a disk tier
        self.horizon = horizon  # batches whose ids the stores see ahead (0: none)
        self.pipeline = StorePipeline(self.collections, depth, horizon) if (depth or horizon) and self.active else None
        # Weak: the loop's own reference must be the last, so a `break` closes the stream at once
        # (stopping the prefetch thread before the loader under it is closed).
        self._streams: weakref.WeakSet[Any] = weakref.WeakSet()

    @classmethod
    def for_components(cls, parts: Any, cfg: StoreConfig) -> StoreMonitor:
        return cls([parts.embeddings, parts.wide], cfg)

    def wrap(self, batches: Iterable[Any], thread: bool = False) -> Iterator[Any]:
        """The batch stream, through the prefetch pipeline when it is on (on a thread of its own with
        ``thread``: StorePipeline.run)."""
        if self.pipeline is None:
            return iter(batches)
        stream = self.pipeline.run(batches, thread=thread)
        self._streams.add(stream)
        return stream

    def close(self) -> None:
        """Stop pipelines still running (a loop that broke out early) and unpin their rows."""
        for s in list(self._streams):
            s.close()

    # ------------------------------------------------------------- reports

    def tables(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for g in self.groups:
            out.update(g.stats())
        return out

    def totals(self, tables: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
        tables = self.tables() if tables is None else tables
        tot = {k: sum(t[k] for t in tables.values()) for k in _SUMMED}
        looked = tot["hits"] + tot["misses"] + tot["new"]
        tot["hit_rate"] = tot["hits"] / looked if looked else float("nan")
        tot["lookup_s"] = sum(g.timers["lookup_s"] for g in self.groups)
        tot["ram_bytes"] = sum(g.nbytes() for g in self.groups)
        tot["disk_file_bytes"] = sum(g.disk_bytes() for g in self.groups)
        return tot

    def describe(self) -> str:
        """One line on the read-ahead stage and the horizon, or "" when there is neither."""
        if self.pipeline is None or not self.pipeline.targets:
            return ""
        parts = []
        if self.pipeline.depth:
            parts.append(f"reading disk rows ahead in windows of up to {self.pipeline.depth} batches, fewer while they "
                         "do not fit in their share of store.memory_budget (store.prefetch, store.prefetch_depth)")
        if self.pipeline.horizon:
            parts.append(f"eviction ranked by the ids of the next {self.pipeline.horizon} batches, which the pipeline "
                         "holds (store.horizon; 0 turns it off)")
        return "store: " + "; ".join(parts)

    def pipeline_stats(self) -> dict[str, float]:
        if self.pipeline is None:
            return {"wait_s": 0.0, "staged_rows": 0}
        return self.pipeline.stats()

    def record(self) -> dict[str, Any]:
        """``{"store": {...}}`` for a metrics record (empty when no table is tiered)."""
        if not self.active:
            return {}
        tables = self.tables()
        return {"store": {"total": self.totals(tables), "pipeline": self.pipeline_stats(), "tables": tables}}

    def summary(self) -> dict[str, Any]:
        """``{"store": totals and pipeline}`` for the run summary (empty when no table is tiered)."""
        if not self.active:
            return {}
        return {"store": {**self.totals(), "pipeline": self.pipeline_stats()}}

    def postfix(self) -> dict[str, str]:
        """A few short progress-bar fields (cheap: counters only)."""
        if not self.active:
            return {}
        hits = misses = new = read = 0
        for g in self.groups:
            c = g.counters.sum(0)
            hits, misses, new = hits + c[Counter.HITS], misses + c[Counter.MISSES], new + c[Counter.NEW]
            read += c[Counter.DISK_READ_ROWS] * 4 * (g.codec.words + 1)  # bytes: a disk record has a lid header
        looked = hits + misses + new
        out = {"hit": f"{hits / looked:.1%}" if looked else "-", "disk_read": format_size(read)}
        if self.pipeline is not None:
            out["wait"] = f"{self.pipeline_stats()['wait_s']:.1f}s"
        return out
