"""StorePipeline: stage 3 of the training pipeline for tiered tables: the disk reads of the next window.

Batches go through in order; the stage looks ``depth`` (k) batches ahead in
windows: when batch ``t`` (a multiple of k) is handed on, the rows of batches
``t + k .. t + 2k - 1`` are deduplicated per tiered group and handed to the
group's :meth:`~tierec.store.group.TieredGroup.stage`, which reads the ones
that live only on disk on its read-ahead threads, as one set (neighbouring
records share a read), while batches ``t .. t + k - 1`` compute. A window is
dropped once its last batch has been looked up. The stage has no thread of
its own: it runs on the caller's between steps, and the reads wait on the
device beside the compute.

Exact by construction: reading ahead changes no number (a lookup uses a
record read ahead only while it is still the row's record), so any ``depth``
trains exactly as none (tests/train/test_pipeline.py, tests/store/).

``stats()``: rows read ahead and used, the reads' wall time and the part of
it the step waited for (``wait_s``): the rest was hidden behind compute.

>>> from tierec.store.pipeline import StorePipeline
>>> pipe = StorePipeline([], depth=1)  # no tiered groups: batches pass through
>>> [b for b in pipe.run(iter([1, 2]))]
[1, 2]
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tierec.embedding.hash_index import Deduper


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
        if depth < 1:
            raise ValueError("the read-ahead depth must be >= 1")
        self.targets = targets_of(collections)
        self.depth = depth
        self.wait_s = 0.0  # the step waiting for the batches upstream (the loader)
        self.stage_s = 0.0  # this stage's own time on the caller's thread (dedupe, starting the reads)
        self.batches = 0
        self._dedupe = Deduper()

    def stats(self) -> dict[str, float]:
        st = [t.group.staging.stats for t in self.targets]
        read_s, wait_s = sum(s.read_s for s in st), sum(s.wait_s for s in st)
        return {
            "wait_s": wait_s,
            "read_ahead_s": read_s,
            "hidden_share": 1.0 - wait_s / read_s if read_s > 0 else float("nan"),
            "stage_s": self.stage_s,
            "staged_rows": sum(s.staged_rows for s in st),
            "staged_used_rows": sum(s.used_rows for s in st),
            "batches": self.batches,
            "depth": self.depth,
        }

    def stage(self, window: list[Any]) -> list[tuple[Any, int]]:
        """Start the reads of a window of batches in every tiered group; (group, token) of each."""
        t0 = time.perf_counter()
        tokens = []
        for t in self.targets:
            keys, tabs = [], []
            for batch in window:
                sparse = batch.sparse if hasattr(batch, "sparse") else batch
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
            token = t.group.stage(k, tb)
            if token is not None:
                tokens.append((t.group, token))
        self.stage_s += time.perf_counter() - t0
        return tokens

    def run(self, batches: Iterable[Any]) -> Iterator[Any]:
        """The batches of ``batches`` in order, the disk reads of the next window running behind each."""
        if not self.targets:
            yield from batches
            return
        k = self.depth
        source = iter(batches)
        ahead: deque[Any] = deque()  # batches t .. t + 2k - 1
        windows: deque[list[tuple[Any, int]]] = deque()

        def pull(n: int) -> None:
            t0 = time.perf_counter()
            while len(ahead) < n:
                try:
                    ahead.append(next(source))
                except StopIteration:
                    break
            self.wait_s += time.perf_counter() - t0

        try:
            pull(k)
            windows.append(self.stage(list(ahead)))  # the first window: read now, waited for by its lookups
            t = 0
            while True:
                if t % k == 0:
                    if t:  # the previous window's batches are all looked up
                        self._release(windows.popleft())
                    pull(2 * k)
                    windows.append(self.stage(list(ahead)[k : 2 * k]))
                if not ahead:
                    return
                t += 1
                self.batches += 1
                yield ahead.popleft()
        finally:
            for w in windows:
                self._release(w)
            for t in self.targets:
                t.group.release_staged()

    @staticmethod
    def _release(window: list[tuple[Any, int]]) -> None:
        for group, token in window:
            group.release_staged(token)
