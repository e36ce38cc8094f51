"""TieredChunkPool: a ChunkPool whose chunks live in the tiered store (fast cache / host DRAM / disk).

With both ``store.enabled`` and ``prune.enabled`` the chunk is what the tiers
hold: every live chunk is one record ``[c weights | c values of each per-dim
optimizer state]`` (a :meth:`~tierec.embedding.layout.RecordLayout.chunks`
layout) of a :class:`~tierec.store.group.TierStore` keyed by its chunk number,
so hot chunks sit in the bounded fast tier, the rest in host DRAM or on disk,
and a pruned chunk frees its record wherever it lives. What stays in RAM for
every chunk is its importance (one float, like the store's directory entry);
per-row data (chunk maps, claims, counts, row-wise Adagrad's
state) stays with the PrunedGroup.

The chunked kernels run unchanged on the fast tier: :meth:`resident` brings a
batch's chunks up and returns their cache slots, and the PrunedGroup hands the
kernels a batch-local chunk map of slots (:meth:`view`). Chunk numbers
are reused from a free list, so they stay dense without compaction.

>>> import numpy as np, tempfile
>>> from tierec.store.spec import TierSpec
>>> pool = TieredChunkPool(4, {}, TierSpec(cache_bytes=16 * 8, host_bytes=0, disk_dir=tempfile.gettempdir()))
>>> ids = pool.alloc(20)  # more chunks than the fast tier's 8 slots: the rest go to disk
>>> pool.num_live, pool.store.stats()["chunks"]["rows_disk"] > 0
(20, True)
>>> float(np.abs(pool.read(ids)["weights"]).sum())  # new chunks are zeros
0.0
>>> pool.close()
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from tierec.embedding.layout import RecordLayout
from tierec.prune import kernels
from tierec.prune.chunk_pool import ChunkView
from tierec.store.group import TierStore
from tierec.store.spec import TierSpec

# (keys [n], tabs [n]) -> (live chunk numbers [m], the position in keys of each one's row)
ChunksOf = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


class TieredChunkPool:
    def __init__(
        self,
        chunk: int,
        dim_state: dict[str, float],
        spec: TierSpec,
        seed: int = 0,
        name: str = "chunks",
    ) -> None:
        """``dim_state``: the initial value of each optimizer state with one value per dim (the chunks hold
        it beside the weights; the updates are the PrunedGroup's chunked kernels); ``name``: the chunk
        store's in store statistics."""
        self.chunk = chunk
        self.dim_state = dict(dim_state)
        # no horizon: the chunk store's lookups are not one per batch (ChunkReadAhead.foresee)
        self.store = TierStore(RecordLayout.chunks(name, chunk, self.dim_state), replace(spec, horizon=0), seed=seed)
        self.importance = np.zeros(0, dtype=np.float32)  # [P] per chunk number, in RAM
        self._free = np.zeros(0, dtype=np.int64)  # stack of free chunk numbers, the top at the end
        self._n_free = 0
        self._high = 0  # chunk numbers handed out so far: 0 .. high-1
        self._batch = max(self.store.capacity // 2, 1)  # chunks made resident at once by bulk operations
        self._imp_scratch: np.ndarray | None = None  # importance by fast-tier slot during an update

    # ------------------------------------------------------------ sizes

    @property
    def capacity(self) -> int:  # chunk numbers in use or free
        return self._high

    @property
    def num_free(self) -> int:
        return self._n_free

    @property
    def num_live(self) -> int:
        return self._high - self._n_free

    def bytes_per_chunk(self) -> int:  # bytes: weights, per-dim state, importance
        return 4 * self.chunk * (1 + len(self.dim_state)) + 4

    def nbytes(self) -> int:
        """Value bytes of the live chunks, wherever they live (a freed chunk's record is gone)."""
        return self.num_live * self.bytes_per_chunk()

    def ram_bytes(self) -> int:  # bytes of RAM: the store (fast tier, host tier, directory) and importance
        return self.store.nbytes() + self.importance.nbytes + self._free.nbytes

    def free_ids(self) -> np.ndarray:  # [num_free] int64
        return self._free[: self._n_free].copy()

    # ------------------------------------------------------- alloc / free

    def alloc(self, n: int) -> np.ndarray:
        """``n`` chunk numbers [n] int64: zero weights, initial state, zero importance."""
        take = min(n, self._n_free)
        reused = self._free[self._n_free - take : self._n_free][::-1].copy()
        self._n_free -= take
        fresh = np.arange(self._high, self._high + n - take, dtype=np.int64)
        self._high += n - take
        if self.importance.shape[0] < self._high:
            self.importance = np.resize(self.importance, max(self._high, int(self.importance.shape[0] * 1.25) + 64))
        ids = np.concatenate([reused, fresh])
        self.reset(ids)
        return ids

    def reset(self, ids: np.ndarray) -> None:
        """Zero weights and importance, initial optimizer state, for chunks ``ids``."""
        if ids.size == 0:
            return
        zeros = {"weights": np.zeros((ids.size, self.chunk), dtype=np.float32)}
        zeros.update({n: np.full((ids.size, self.chunk), v, dtype=np.float32) for n, v in self.dim_state.items()})
        self.write(ids, zeros)
        self.importance[ids] = 0.0

    def free(self, ids: np.ndarray) -> None:
        """Return chunks to the free list; their records leave every tier."""
        n = ids.shape[0]
        if n == 0:
            return
        self.store.delete_records(ids.astype(np.int64), np.zeros(n, dtype=np.int32))
        if self._n_free + n > self._free.shape[0]:
            self._free = np.resize(self._free, max(self._n_free + n, int(self._free.shape[0] * 1.25) + 64))
        self._free[self._n_free : self._n_free + n] = ids[::-1]
        self._n_free += n

    def compact(self, order: np.ndarray | None = None) -> np.ndarray:  # pragma: no cover - never called
        raise NotImplementedError("a tiered chunk pool does not compact: freed records leave the tiers at once")

    # ------------------------------------------------------- chunk data

    def resident(self, ids: np.ndarray) -> np.ndarray:
        """Fast-tier slots [n] of unique chunks ``ids``, brought up; valid until the next call."""
        return self.store.lookup(ids.astype(np.int64), np.zeros(ids.shape[0], dtype=np.int32), insert=True).numpy()

    def arrays(self) -> dict[str, np.ndarray]:
        """The fast tier's arrays [C + 1, c] by name ("weights" and each per-dim state)."""
        out = {"weights": self.store.weights.numpy()}
        out.update({n: s.numpy() for n, s in self.store.state.items()})
        return out

    def write(self, ids: np.ndarray, values: dict[str, np.ndarray]) -> None:
        """Set chunks ``ids`` (unique) to ``values`` ([n, c] per name), in batches the fast tier holds."""
        for lo in range(0, ids.size, self._batch):
            part = slice(lo, lo + self._batch)
            slots = self.resident(ids[part])
            arrays = self.arrays()
            for name, v in values.items():
                arrays[name][slots] = v[part]

    def read(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Chunks ``ids`` [n, c] per name, read wherever they live (no movement between tiers)."""
        found, rec = self.store.records_of(ids.astype(np.int64), np.zeros(ids.shape[0], dtype=np.int32))
        if not found.all():
            raise KeyError(f"chunks {ids[~found][:5].tolist()} are not in the store")
        out, col = {"weights": rec[:, : self.chunk]}, self.chunk
        for name in self.store.state:
            out[name] = rec[:, col : col + self.chunk]
            col += self.chunk
        return out

    def tier_stores(self) -> list[TierStore]:
        return [self.store]

    def prefetcher(self, chunks_of: ChunksOf) -> ChunkReadAhead | None:
        """The read-ahead of this pool's chunks for upcoming (table, id) pairs, which ``chunks_of`` turns into
        chunk numbers (and the pair each belongs to); None where the store has no disk to read from or no
        memory for it."""
        store = self.store.prefetcher()
        return ChunkReadAhead(store, chunks_of) if store is not None else None

    def close(self) -> None:
        self.store.close()

    # ------------------------------------------------------- rows through a chunk map

    def gather_dense(self, name: str, cmap: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        """out [n, D] = array ``name`` of ``rows`` through ``cmap`` (zeros past prefixes and for -1)."""
        cm = _local_cmap(cmap, rows)
        live = cm >= 0
        if live.any():
            out.reshape(rows.shape[0], cm.shape[1], self.chunk)[live] = self.read(cm[live].astype(np.int64))[name]

    def scatter_dense(self, name: str, cmap: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
        """Write ``values`` [n, D] into the live chunks of ``rows`` (unique, all >= 0)."""
        cm = cmap[rows]
        live = cm >= 0
        if live.any():
            vals = values.reshape(rows.shape[0], cm.shape[1], self.chunk)[live]
            self.write(cm[live].astype(np.int64), {name: vals})

    def view(self, cmap: np.ndarray, rows: np.ndarray) -> ChunkView:
        """The batch's chunks made resident: a batch-local map of their slots, local rows 0..U-1."""
        cm = _local_cmap(cmap, rows)
        live = cm >= 0
        ids = cm[live].astype(np.int64)
        slots = self.resident(ids)
        local = np.full(cm.shape, -1, dtype=np.int32)
        local[live] = slots
        lrows = np.where(rows >= 0, np.arange(rows.shape[0]), -1).astype(np.int64)
        start = np.empty(rows.shape[0], dtype=np.int64)
        length = np.empty(rows.shape[0], dtype=np.int64)
        kernels.row_segments(local, lrows, start, length)
        return ChunkView(self.arrays(), local, lrows, start, length, ids, slots)

    def update_buffers(self, view: ChunkView, rows: np.ndarray, next_imp: np.ndarray, row_state: dict[str, Tensor]):
        """(importance by slot, the rows' claims, the rows' per-row state): the kernels index by local row."""
        n_slots = view.arrays["weights"].shape[0]
        if self._imp_scratch is None or self._imp_scratch.shape[0] != n_slots:
            self._imp_scratch = np.zeros(n_slots, dtype=np.float32)
        r = torch.from_numpy(rows)
        return self._imp_scratch, next_imp[rows].copy(), {n: s[r].clone() for n, s in row_state.items()}

    def finish_update(self, view: ChunkView, rows: np.ndarray, bufs, next_imp: np.ndarray, row_state: dict[str, Tensor]) -> None:
        imp, nxt, local_state = bufs
        self.importance[view.ids] += imp[view.slots]
        imp[view.slots] = 0.0  # the scratch stays zero between batches
        next_imp[rows] = nxt
        r = torch.from_numpy(rows)
        for n, s in local_state.items():
            row_state[n][r] = s

    def compact_rows(self, cmap: np.ndarray, live: np.ndarray) -> bool:
        return False  # nothing to compact: a freed chunk's record left the tiers at once


def _local_cmap(cmap: np.ndarray, rows: np.ndarray) -> np.ndarray:  # [n, K] chunk numbers of rows, all -1 for row -1
    cm = cmap[np.maximum(rows, 0)].copy()
    cm[rows < 0] = -1
    return cm


class ChunkReadAhead:
    """The store pipeline's read-ahead (``embedding.storage.Prefetching``) for a pruned group's tiered chunks.

    The pipeline names the (table, id) pairs of a window of upcoming batches
    and the lookup each is last needed at; their rows' live chunks that live
    only on disk are read on the store's read-ahead threads, and the ones in
    the fast tier are kept there until then, unless a lookup needs their slots
    (chunks are fp32 records: placement changes no number). A lookup takes a
    chunk's record from the window while it is still current. The chunk store
    counts more lookups than batches (new rows' chunks and pruning steps look
    chunks up too), so a chunk's keep ends early rather than late. Chunks of
    rows made or pruned after the window was read are read on demand.
    """

    def __init__(self, store: TierStore, chunks_of: ChunksOf) -> None:
        self.store = store
        self.chunks_of = chunks_of

    @property
    def staging(self):  # tierec.store.staging.Staging: its ``stats``
        return self.store.staging

    def stage(self, keys: np.ndarray, tabs: np.ndarray, next_use: np.ndarray | None = None) -> int | None:
        ids, pair = self.chunks_of(keys, tabs)  # unique chunks: each belongs to one row
        if ids.size == 0:
            return None
        return self.store.stage(ids, np.zeros(ids.size, dtype=np.int32), None if next_use is None else next_use[pair])

    def foresee(self, keys: np.ndarray, tabs: np.ndarray) -> None:
        """Nothing (and None found): the chunk store's lookups are not one per batch (new rows' chunks and pruning steps look
        chunks up too), so a horizon counted in batches would not line up with them."""

    def release_staged(self, token: int | None = None) -> None:
        self.store.release_staged(token)

    def read_ahead_fill(self) -> tuple[int, int, int | None]:
        return self.store.read_ahead_fill()
