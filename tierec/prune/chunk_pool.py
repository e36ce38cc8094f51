"""ChunkPool: fixed-size chunks of embedding dims, with a free list and compaction.

One pool holds the chunks of every row of a table group: the weights
``[P, c]``, the optimizer state that has one value per dim (Adagrad's sum,
Adam's moments) ``[P, c]`` each, and one importance score per chunk ``[P]``.
A chunk is addressed by its physical number; rows keep a map from their chunk
positions to these numbers (PrunedGroup). Freed chunks go on a LIFO free list
and are handed out again before the pool grows; ``compact`` moves the live
chunks at the tail into the holes and really shrinks the tensors.

>>> pool = ChunkPool(4, {"sum": 0.0})
>>> ids = pool.alloc(3)
>>> pool.free(ids[:2]); pool.num_live
1
>>> pool.alloc(1).tolist() == [ids[0]]   # a freed chunk is reused first
True
>>> new_of = pool.compact(); pool.capacity, pool.num_free  # only the 2 live chunks remain
(2, 0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tierec.prune import kernels

GROWTH = 1.25  # capacity factor when the free list runs dry


@dataclass
class ChunkView:
    """What the chunked kernels read and update for one batch of rows.

    In memory: the pool's arrays, the group's chunk map and the rows themselves,
    importance by chunk number and the group's per-row arrays. Tiered: the fast
    tier's arrays, a batch-local chunk map of cache slots ``[U, K]`` and local
    rows ``0..U-1`` (-1 kept), importance by slot and per-row arrays of the batch;
    :meth:`ChunkPool.finish_update` carries them back.
    """

    arrays: dict[str, np.ndarray]  # "weights" and each per-dim state, [P or C+1, c]
    cmap: np.ndarray
    rows: np.ndarray  # [U] rows for the kernels
    start: np.ndarray  # [U] kernels.row_segments of (cmap, rows)
    length: np.ndarray
    ids: np.ndarray | None = None  # tiered: chunk numbers of the live cells of the local map, row-major
    slots: np.ndarray | None = None  # tiered: their fast-tier slots


def segments(cmap: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start [U], length [U]) of a batch's rows for the hot kernels (see kernels.row_segments)."""
    start = np.empty(rows.shape[0], dtype=np.int64)
    length = np.empty(rows.shape[0], dtype=np.int64)
    kernels.row_segments(cmap, rows, start, length)
    return start, length


class ChunkPool:
    def __init__(self, chunk: int, dim_state: dict[str, float], capacity: int = 0) -> None:
        """``dim_state``: name -> initial value of each optimizer state with one value per dim."""
        self.chunk = chunk
        self.dim_state = dict(dim_state)
        self.weights = torch.zeros(capacity, chunk)  # [P, c]
        self.state = {n: torch.full((capacity, chunk), v) for n, v in self.dim_state.items()}  # [P, c] each
        self.importance = np.zeros(capacity, dtype=np.float32)  # [P]
        # Stack of free chunk numbers, the top at the end; sized on demand and emptied by compaction.
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int32)
        self._n_free = capacity

    # ------------------------------------------------------------ sizes

    @property
    def capacity(self) -> int:
        return self.weights.shape[0]

    @property
    def num_free(self) -> int:
        return self._n_free

    @property
    def num_live(self) -> int:
        return self.capacity - self._n_free

    def bytes_per_chunk(self) -> int:  # bytes: weights, per-dim state, importance
        return 4 * self.chunk * (1 + len(self.state)) + 4

    def nbytes(self) -> int:  # bytes allocated: every chunk (live and free) and the free list
        return self.capacity * self.bytes_per_chunk() + self._free.nbytes

    def free_ids(self) -> np.ndarray:  # [num_free] int64
        return self._free[: self._n_free].astype(np.int64)

    # ------------------------------------------------------- alloc / free

    def alloc(self, n: int) -> np.ndarray:
        """``n`` chunk numbers [n] int64: zero weights, initial state, zero importance."""
        if n > self._n_free:
            self._grow(self.num_live + n)
        ids = self._free[self._n_free - n : self._n_free][::-1].astype(np.int64)
        self._n_free -= n
        self.reset(ids)
        return ids

    def reset(self, ids: np.ndarray) -> None:
        """Zero weights and importance, initial optimizer state, for chunks ``ids``."""
        if ids.size == 0:
            return
        t = torch.from_numpy(ids)
        self.weights.index_fill_(0, t, 0.0)
        for n, s in self.state.items():
            s.index_fill_(0, t, self.dim_state[n])
        self.importance[ids] = 0.0

    def free(self, ids: np.ndarray) -> None:
        """Return chunks to the free list (their contents are reset when handed out again)."""
        n = ids.shape[0]
        if n == 0:
            return
        if self._n_free + n > self._free.shape[0]:
            self._free = np.resize(self._free, max(self._n_free + n, int(self._free.shape[0] * GROWTH) + 64))
        self._free[self._n_free : self._n_free + n] = ids[::-1]
        self._n_free += n

    def _grow(self, needed: int) -> None:
        old = self.capacity
        cap = max(needed, int(old * GROWTH) + 64)
        self.weights = _resized(self.weights, cap)
        self.state = {n: _resized(s, cap) for n, s in self.state.items()}
        self.importance = np.resize(self.importance, cap)
        free = np.empty(cap - old + self._n_free, dtype=np.int32)
        # the new chunks go under the existing free ones, so reuse still comes first
        new = np.arange(cap - 1, old - 1, -1, dtype=np.int32)
        free[: new.size] = new
        free[new.size : new.size + self._n_free] = self._free[: self._n_free]
        self._free = free
        self._n_free += new.size

    def ram_bytes(self) -> int:  # bytes of RAM: all of it
        return self.nbytes()

    def tier_stores(self) -> list:  # in memory: no tiered store
        return []

    def prefetcher(self, chunks_of) -> None:  # in memory: nothing to read ahead
        return None

    def close(self) -> None:
        pass

    # ------------------------------------------------------- rows through a chunk map

    def _array(self, name: str) -> np.ndarray:
        return (self.weights if name == "weights" else self.state[name]).numpy()

    def gather_dense(self, name: str, cmap: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        """out [n, D] = array ``name`` of ``rows`` through ``cmap`` (zeros past prefixes and for -1)."""
        kernels.gather_rows(self._array(name), cmap, rows, out)

    def scatter_dense(self, name: str, cmap: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
        """Write ``values`` [n, D] into the live chunks of ``rows`` (unique, all >= 0)."""
        kernels.scatter_rows(self._array(name), cmap, rows, values)

    def view(self, cmap: np.ndarray, rows: np.ndarray) -> ChunkView:
        start, length = segments(cmap, rows)
        arrays = {"weights": self.weights.numpy(), **{n: s.numpy() for n, s in self.state.items()}}
        return ChunkView(arrays, cmap, rows, start, length)

    def update_buffers(self, view: ChunkView, rows: np.ndarray, next_imp: np.ndarray, row_state: dict[str, Tensor]):
        """(importance, next_imp, row_state) the update kernels accumulate into, indexed like ``view``."""
        return self.importance, next_imp, row_state

    def finish_update(self, view: ChunkView, rows: np.ndarray, bufs, next_imp: np.ndarray, row_state: dict[str, Tensor]) -> None:
        """Carry the update's buffers back (in memory they were the arrays themselves)."""

    def compact_rows(self, cmap: np.ndarray, live: np.ndarray) -> bool:
        """Compact to the live chunks of rows ``cmap`` [n, K] (``live`` [n] chunks each), each row's
        chunks one after another in row order, and renumber ``cmap`` in place. True: compacted."""
        mask = np.arange(cmap.shape[1]) < live[:, None]  # [n, K]
        order = cmap[mask].astype(np.int64)  # row by row, position by position
        self.compact(order)
        cmap[mask] = np.arange(order.shape[0], dtype=np.int32)
        return True

    # ------------------------------------------------------------ compaction

    def compact(self, order: np.ndarray | None = None) -> np.ndarray:
        """Keep only the live chunks, in ``order`` (default: by number), and shrink every tensor.

        ``order`` [num_live] lists every live chunk once; chunk ``order[i]`` becomes chunk
        ``i``. Returns the map old number -> new number ([old capacity] int64, -1 for
        free chunks) for the caller's chunk maps.
        """
        if order is None:
            is_free = np.zeros(self.capacity, dtype=bool)
            is_free[self._free[: self._n_free]] = True
            order = np.flatnonzero(~is_free)
        if order.shape[0] != self.num_live:
            raise ValueError(f"order lists {order.shape[0]} chunks, the pool has {self.num_live} live ones")
        new_of = np.full(self.capacity, -1, dtype=np.int64)
        new_of[order] = np.arange(order.shape[0])
        idx = torch.from_numpy(np.ascontiguousarray(order, dtype=np.int64))
        self.weights = self.weights.index_select(0, idx)
        self.state = {n: t.index_select(0, idx) for n, t in self.state.items()}
        self.importance = self.importance[order]
        self._free = np.empty(0, dtype=np.int32)
        self._n_free = 0
        return new_of


def _resized(t: Tensor, rows: int) -> Tensor:
    out = torch.empty(rows, *t.shape[1:], dtype=t.dtype)
    n = min(rows, t.shape[0])
    out[:n].copy_(t[:n])
    return out
