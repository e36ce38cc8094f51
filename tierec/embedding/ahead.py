"""The next batch's dedupe and index probe (or, in the tiers, its whole lookup) on a thread of its own
while this step trains.

ScaleFreeCTR overlaps a batch's id work with the previous batch's compute.
:meth:`EmbeddingCollection.prepare <tierec.embedding.collection.EmbeddingCollection.prepare>`
does steps 1 and 2 of the forward without changing a table: the dedupe of the
batch's (table, id) pairs, and the rows of the pairs already in the table (a
read-only probe). :class:`LookAhead` runs it for batch ``t + 1`` on a
background thread with its own numba thread budget, submitted once batch
``t``'s forward has inserted its ids, and hands it to batch ``t + 1``'s
forward, which inserts the ids still missing in the same order as without
it. So the rows, the values and the training are exactly those of the
sequential path (tests/embedding/test_ahead.py).

With ``bring_up`` the tiered groups do the next batch's training lookup there
(:meth:`~tierec.store.group.TierStore.lookup_ahead`: rows brought up from
host and disk, evictions, write-backs), which changes the tables: the batch
submitted must be the next one trained (``take`` refuses any other), and the
caller submits only when nothing else will use the tables before it (a
checkpoint, an evaluation).

>>> import torch
>>> from tierec.batch import SparseFeatures
>>> from tierec.config import EmbeddingConfig
>>> from tierec.embedding import EmbeddingCollection, tables_from_config
>>> from tierec.embedding.ahead import LookAhead
>>> coll = EmbeddingCollection(tables_from_config(EmbeddingConfig(dim=4), ["a", "b"]), ["a", "b"])
>>> sp = SparseFeatures.one_hot(("a", "b"), torch.tensor([[1, 2], [1, 3]]))
>>> with LookAhead(coll) as ahead:
...     ahead.submit(sp)
...     out = coll(sp, ahead.take(sp))
>>> out.shape
torch.Size([2, 2, 4])
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import torch
from torch import Tensor

from tierec.embedding.hash_index import Deduper


@dataclass(frozen=True)
class Prepared:
    """One table group's part of a prepared batch."""

    keys: np.ndarray  # [U] int64 unique keys, first-seen order
    tabs: np.ndarray  # [U] int32 their tables (within the group)
    inverse: np.ndarray  # [N] int64 id occurrence -> unique position
    offsets: np.ndarray  # [F_g * B + 1] int64 the group's bag offsets
    found: np.ndarray | None  # [U] int64 rows known at probe time, -1 absent; None: not probed
    known: Any = None  # tierec.store.staging.Resolved: the pairs as the tiers' read-ahead window found them

    def rest(self, group: Any, insert: bool) -> Tensor:
        """Rows [U] of the unique pairs: the probed ones, and a lookup (inserting when ``insert``)
        of those absent at probe time, in their order, so new rows are numbered as without the probe."""
        if self.found is None:
            if self.known is not None:
                return group.lookup(self.keys, self.tabs, insert=insert, known=self.known)
            return group.lookup(self.keys, self.tabs, insert=insert)
        rows = self.found.copy()
        missing = np.flatnonzero(rows < 0)
        if missing.size:
            rows[missing] = group.lookup(self.keys[missing], self.tabs[missing], insert=insert).numpy()
        return torch.from_numpy(rows)


@dataclass(frozen=True)
class Ahead:
    """A prepared batch: valid for ``forward`` of that very ``SparseFeatures`` object."""

    sparse: Any  # the SparseFeatures it was prepared from (compared by identity)
    parts: list[Prepared]  # one per table group, in the collection's plan order


class LookAhead:
    """Prepares the next batch on one background thread with ``threads`` numba threads.

    Use: after batch ``t``'s embedding forward, ``submit(next_sparse)``; before
    batch ``t + 1``'s forward, ``take(next_sparse)`` (waits, then returns the
    :class:`Ahead`, or None when nothing was submitted for that batch).
    """

    def __init__(self, collection: Any, threads: int = 1, *, probe: bool = True, bring_up: bool = False) -> None:
        self.collection = collection
        self.threads = max(1, threads)
        self.probe, self.bring_up = probe, bring_up  # see EmbeddingCollection.prepare
        self._dedupe = Deduper()  # this thread's scratch: the collection's own is the main thread's
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tierec-ahead")
        self._pending: tuple[Any, Future] | None = None

    def _prepare(self, sparse: Any) -> Ahead:
        numba.set_num_threads(self.threads)  # per thread in numba: the main thread keeps its own
        with torch.no_grad():
            return self.collection.prepare(sparse, self._dedupe, probe=self.probe, bring_up=self.bring_up)

    def submit(self, sparse: Any) -> None:
        self.take(None)  # one in flight at most
        self._pending = (sparse, self._pool.submit(self._prepare, sparse))

    def take(self, sparse: Any) -> Ahead | None:
        if self._pending is None:
            return None
        submitted, fut = self._pending
        self._pending = None
        result = fut.result()  # always wait: nothing may probe while the table changes
        if submitted is sparse:
            return result
        if self.bring_up and sparse is not None:
            raise RuntimeError("a batch was looked up ahead in the tiers but another one came next")
        return None

    @property
    def pending(self) -> bool:
        """A batch was submitted and not taken yet (with ``bring_up``: the tables have moved on to it)."""
        return self._pending is not None

    def close(self) -> None:
        self.take(None)
        self._pool.shutdown(wait=True)

    def __enter__(self) -> LookAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
