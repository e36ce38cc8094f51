"""StorePipeline: the store stage between the loader and the compute (ScaleFreeCTR's three stages).

1. the loader thread reads and decodes batches (tierec.data.BackgroundLoader);
2. this stage's thread takes the next batch, deduplicates its ids per table
   group and brings the rows that are not in the fast tier up from host or
   disk (:meth:`TieredGroup.prefetch`), pinning them;
3. the main thread computes batch t meanwhile, then takes batch t + 1, whose
   rows are resident.

Exact by construction: prefetching only moves rows up and never inserts,
counts or updates; the batch in flight pins its rows, so an update always
lands on the single resident copy and is never lost or applied twice. (A
bounded-staleness mode is not needed: the prefetch of t + 1 never waits for
t's update, because it only touches rows t does not use.)

``wait_s`` is the time the compute waited on this stage (for the next batch,
and for a group's lock while a prefetch held it).

>>> import torch
>>> from tierec.batch import SparseFeatures
>>> from tierec.store.pipeline import StorePipeline
>>> pipe = StorePipeline([], depth=1)  # no tiered groups: batches pass through
>>> [b for b in pipe.run(iter([1, 2]))]
[1, 2]
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tierec.embedding.hash_index import Deduper

_POLL = 0.1  # seconds between checks of the stop flag
_DONE = object()


@dataclass(frozen=True)
class _Failed:
    error: BaseException


@dataclass(frozen=True)
class _Target:
    """Where one prefetching storage's ids sit in a batch: (feature name, table index in the group)."""

    group: Any  # tierec.embedding.storage.Prefetching
    features: tuple[tuple[str, int], ...]


def targets_of(collections: list[Any]) -> list[_Target]:
    """The storages of some EmbeddingCollections that can prefetch, with the features each reads."""
    out = []
    for coll in collections:
        for g in coll.groups:
            p = g.prefetcher()
            if p is not None:
                feats = tuple((f, ti) for ti, t in enumerate(g.tables) for f in t.features)
                out.append(_Target(group=p, features=feats))
    return out


class StorePipeline:
    def __init__(self, collections: list[Any], depth: int = 1) -> None:
        self.targets = targets_of(collections)
        self.depth = depth
        self.wait_s = 0.0  # compute waiting for the next batch
        self.prefetch_s = 0.0  # this stage's busy time
        self.rows = 0  # rows brought up ahead
        self.batches = 0
        self._dedupe = Deduper()  # used by this stage's thread only

    def stats(self) -> dict[str, float]:
        lock_wait = sum(t.group.timers["lock_wait_s"] for t in self.targets)
        return {
            "wait_s": self.wait_s + lock_wait,
            "wait_batch_s": self.wait_s,
            "wait_lock_s": lock_wait,
            "prefetch_s": self.prefetch_s,
            "prefetched_rows": self.rows,
            "batches": self.batches,
        }

    def prefetch(self, sparse: Any) -> int:
        """Bring one batch's known rows up in every tiered group; returns rows moved."""
        moved = 0
        for t in self.targets:
            keys, tabs = [], []
            for f, ti in t.features:
                if f not in sparse.keys:
                    continue
                lo, hi = sparse.feature_span(sparse.index(f))
                ids = sparse.values[lo:hi].numpy()
                keys.append(ids)
                tabs.append(np.full(ids.shape[0], ti, dtype=np.int32))
            if not keys:
                continue
            k, tb, _ = self._dedupe(np.concatenate(keys).astype(np.int64, copy=False), np.concatenate(tabs))
            moved += t.group.prefetch(k, tb)
        return moved

    def run(self, batches: Iterable[Any]) -> Iterator[Any]:
        """The batches of ``batches``, each after its rows were brought up (at most ``depth`` ahead)."""
        if not self.targets:
            yield from batches
            return
        q: queue.Queue[Any] = queue.Queue(maxsize=self.depth)
        stop = threading.Event()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=_POLL)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                for batch in batches:
                    if stop.is_set():
                        return
                    t0 = time.perf_counter()
                    self.rows += self.prefetch(batch.sparse if hasattr(batch, "sparse") else batch)
                    self.prefetch_s += time.perf_counter() - t0
                    if not put(batch):
                        return
                put(_DONE)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                put(_Failed(e))

        worker = threading.Thread(target=produce, name="tierec-store-prefetch", daemon=True)
        worker.start()
        try:
            while True:
                t0 = time.perf_counter()
                item = q.get()
                self.wait_s += time.perf_counter() - t0
                if item is _DONE:
                    return
                if isinstance(item, _Failed):
                    raise item.error
                self.batches += 1
                yield item
        finally:
            stop.set()
            worker.join()
            for t in self.targets:
                t.group.release_prefetched()
