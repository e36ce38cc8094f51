"""PrunedGroup: the storage of a table group whose rows are chunks in a shared ChunkPool, each row a prefix.

Row ``r`` maps its chunk positions to pool chunks through ``cmap[r]``
(the virtual-to-physical index, ``[R, D/c]`` int32, -1 past the row's
prefix). Its dims past the prefix read as zero and are not trained. The
optimizer state with one value per dim lives in the pool beside the weights
and is freed with its chunk; row-wise Adagrad's one float per row stays with
the row. Each live chunk carries an importance (decayed sum of its gradient
norms, i.e. access frequency times gradient magnitude), and each row a claim
``next_imp`` of its first pruned chunk to grow back, and (importance by
gradient) a decayed access count, with which :meth:`keep_scores` shrinks a
row's mean gradient magnitude toward its table's; the Pruner
(tierec/prune/pruner.py) reads them to decide the dims.

With every row at full dim the forward and the updates are bit-identical to
TableGroup (tests/prune/test_prune_exact.py). The chunks' placement is the
group's pool: a :class:`~tierec.prune.chunk_pool.ChunkPool` in memory, or a
:class:`~tierec.prune.tiered_pool.TieredChunkPool` in the tiered store, where
each batch's chunks are brought into the fast tier and the kernels run on it
through a batch-local map of cache slots (the pool's ``view``), with the same
results as the all-in-memory pool (tests/prune/test_tiered_prune.py). Both
implement :class:`~tierec.embedding.storage.RowStorage` (and the pruner's
``ChunkImportance``).

>>> import numpy as np
>>> from tierec.config import PruneConfig
>>> from tierec.embedding.table import TableConfig
>>> g = PrunedGroup([TableConfig(name="t", dim=8, features=["f"])], PruneConfig(chunk=4))
>>> rows = g.lookup(np.array([5, 6], dtype=np.int64), np.zeros(2, dtype=np.int32), insert=True).numpy()
>>> g.set_row_dims(rows[:1], np.array([4]))
>>> g.gather(rows)[0, 4:].abs().sum().item(), g.dim_histogram().tolist()
(0.0, [0, 1, 1])
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from tierec.config import ConfigError, OptimizerKind, PruneConfig
from tierec.embedding import kernels as engine_kernels
from tierec.embedding.changes import ChangeTracker
from tierec.embedding.hash_index import HashIndex
from tierec.embedding.optimizers import adam_step_size, initial_state_value, state_shapes
from tierec.embedding.pool_ops import BagLayout
from tierec.embedding.storage import Prefetching
from tierec.embedding.table import TableConfig, group_layout, init_scales
from tierec.prune import kernels
from tierec.prune.chunk_pool import ChunkPool, ChunkView, segments
from tierec.prune.pool_ops import pool_chunked, pool_chunked_torch


class PrunedGroup:
    counts_accesses = True  # importance (frequency, shrinkage counts) needs the accesses of each row

    def __init__(
        self,
        tables: list[TableConfig],
        cfg: PruneConfig,
        seed: int = 0,
        device: torch.device | str = "cpu",
        pool: ChunkPool | None = None,
    ) -> None:
        """``pool``: where the chunks live (the placement): a ChunkPool in memory (the default, made
        here) or a :class:`~tierec.prune.tiered_pool.TieredChunkPool`, with this group's chunk size
        and per-dim state (:meth:`dim_state_of`)."""
        self.tables = tables
        self.dim, self.optimizer = group_layout(tables)
        self.seed = seed  # of new rows' values
        self.device = torch.device(device)
        self.scales = init_scales(tables)  # [n_tables]
        self.step = 0  # updates applied (Adam's bias correction)
        self.changes = ChangeTracker(len(tables))  # rows changed since the last publication, once started
        if self.device.type != "cpu":
            raise NotImplementedError("pruned tables run on the CPU only (the chunk kernels are numba)")
        if self.dim % cfg.chunk:
            raise ConfigError(f"embedding dim {self.dim} is not a multiple of prune.chunk={cfg.chunk}")
        self.cfg = cfg
        self.chunk = cfg.chunk
        self.n_pos = self.dim // cfg.chunk  # chunk positions per row
        self.kernels = kernels.hot_kernels(cfg.chunk)  # forward and optimizers, specialised to the chunk size
        self.init_chunks = min(cfg.init_dim // cfg.chunk or self.n_pos, self.n_pos)
        self.by_grad = cfg.importance == "gradient"
        self.shrinkage = float(cfg.shrinkage) if self.by_grad else 0.0
        self.index = HashIndex(n_tables=len(tables))
        shapes = state_shapes(self.optimizer.kind, self.dim)
        self.row_state_init = {n: initial_state_value(self.optimizer, n) for n, s in shapes.items() if not s}
        self.chunks = pool if pool is not None else ChunkPool(self.chunk, self.dim_state_of(self.optimizer, self.dim))
        if pool is not None and (pool.chunk != self.chunk or set(pool.dim_state) != set(self.dim_state_of(self.optimizer, self.dim))):
            raise ValueError("the chunk pool's chunk size or per-dim state does not match the group's")
        cap = self.index.row_capacity
        self.cmap = np.full((cap, self.n_pos), -1, dtype=np.int32)  # [R, K] physical chunk or -1
        self.next_imp = np.zeros(cap, dtype=np.float32)  # [R] claim of the first pruned chunk to grow back
        self.count = np.zeros(cap if self.shrinkage else 0, dtype=np.float32)  # [R] decayed accesses (shrinkage only)
        self.row_state = {n: torch.full((cap,), v) for n, v in self.row_state_init.items()}  # [R] each
        self.pruned = np.zeros(len(tables), dtype=np.int64)  # chunks pruned, per table
        self.regrown = np.zeros(len(tables), dtype=np.int64)  # chunks grown back, per table
        self.evicted = np.zeros(len(tables), dtype=np.int64)  # rows forgotten at dim 0, per table
        self.decays = np.zeros(len(tables), dtype=np.int64)  # importance decays so far (a delta's catch-up)
        # a record: full-dim weights, each per-dim state, per-row state, then the row's dims
        self.record_width = self.dim * (1 + len(self.chunks.dim_state)) + len(self.row_state) + 1

    @staticmethod
    def dim_state_of(optimizer, dim: int) -> dict[str, float]:
        """Initial value of each optimizer state with one value per dim (what the chunks hold)."""
        shapes = state_shapes(optimizer.kind, dim)
        return {n: initial_state_value(optimizer, n) for n, s in shapes.items() if s}

    @property
    def num_rows(self) -> int:
        return self.index.num_rows

    def lookup(self, keys: np.ndarray, tabs: np.ndarray, insert: bool) -> Tensor:
        """Rows [U] int64 of unique (table, key) pairs; new ones are inserted with ``init_dim`` dims.

        Without ``insert`` an unknown pair gets row -1.
        """
        found = self.index.lookup(keys, tabs, insert)
        if insert:
            self._grow_storage()
            if found.new.size:
                self._init_rows(found.rows[found.new], keys[found.new], tabs[found.new])
        return torch.from_numpy(found.rows)

    def rows_per_table(self) -> np.ndarray:  # [n_tables]
        return self.index.rows_per_table(len(self.tables))

    # ------------------------------------------------------------------ rows

    def _grow_storage(self) -> None:
        cap, old = self.index.row_capacity, self.cmap.shape[0]
        if cap <= old:
            return
        cmap = np.full((cap, self.n_pos), -1, dtype=np.int32)
        cmap[:old] = self.cmap
        self.cmap = cmap
        self.next_imp = np.concatenate([self.next_imp, np.zeros(cap - old, dtype=np.float32)])
        if self.shrinkage:
            self.count = np.concatenate([self.count, np.zeros(cap - old, dtype=np.float32)])
        for n, s in self.row_state.items():
            self.row_state[n] = torch.cat([s, torch.full((cap - old,), self.row_state_init[n])])

    def _init_rows(self, rows: np.ndarray, keys: np.ndarray, tabs: np.ndarray) -> None:
        """New rows get ``init_chunks`` chunks holding the same values a TableGroup would give them."""
        self.changes.changed(keys, tabs)
        self._set_chunks(rows, np.full(rows.shape[0], self.init_chunks, dtype=np.int64))
        w = np.empty((rows.shape[0], self.dim), dtype=np.float32)
        engine_kernels.init_rows(w, np.arange(rows.shape[0]), keys, tabs.astype(np.int32), self.scales, self.seed)
        self._scatter_dense("weights", rows, w)
        self.next_imp[rows] = 0.0
        if self.shrinkage:
            self.count[rows] = 0.0
        r = torch.from_numpy(rows)
        for n, s in self.row_state.items():
            s.index_fill_(0, r, self.row_state_init[n])

    def _set_chunks(self, rows: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Give each of ``rows`` (unique) exactly ``counts`` live chunks; freed chunks are reused first.

        New chunks are zero with fresh optimizer state. Returns the rows' previous counts
        and the chunk numbers freed (in row, then position order).
        """
        pos = np.arange(self.n_pos)
        live = self.live_chunks(rows)
        shrink = counts < live
        freed = np.empty(0, dtype=np.int64)
        if shrink.any():
            r = rows[shrink]
            sub = self.cmap[r]  # [S, K]
            mask = (pos >= counts[shrink, None]) & (pos < live[shrink, None])
            freed = sub[mask].astype(np.int64)
            sub[mask] = -1
            self.cmap[r] = sub
            self.chunks.free(freed)
        grow = counts > live
        if grow.any():
            r = rows[grow]
            mask = (pos >= live[grow, None]) & (pos < counts[grow, None])
            ids = self.chunks.alloc(int(mask.sum()))
            sub = self.cmap[r]
            sub[mask] = ids
            self.cmap[r] = sub
        return live, freed

    def set_row_dims(self, rows: np.ndarray, dims: np.ndarray) -> None:
        """Prune (or grow, with zeros) ``rows`` to ``dims`` dims each, multiples of the chunk."""
        dims = np.asarray(dims, dtype=np.int64)
        if (dims % self.chunk).any() or (dims < 0).any() or (dims > self.dim).any():
            raise ValueError(f"row dims must be multiples of {self.chunk} in [0, {self.dim}]")
        self._set_chunks(np.asarray(rows, dtype=np.int64), dims // self.chunk)

    def live_chunks(self, rows: np.ndarray | None = None) -> np.ndarray:  # [n] int64
        """Live chunk count (prefix length) of ``rows``, or of every row."""
        if rows is None:
            out = np.empty(self.num_rows, dtype=np.int64)
            kernels.live_chunks(self.cmap, self.num_rows, out)
            return out
        return (self.cmap[rows] >= 0).sum(axis=1).astype(np.int64)

    def gather(self, rows: np.ndarray) -> Tensor:  # [U, D] dense, zeros past each prefix (and for -1)
        return torch.from_numpy(self._gather_dense("weights", rows))

    def _gather_dense(self, name: str, rows: np.ndarray) -> np.ndarray:
        """[n, D] of array ``name`` ("weights" or a per-dim state) of ``rows``, zeros past prefixes and for -1."""
        out = np.zeros((rows.shape[0], self.dim), dtype=np.float32)
        self.chunks.gather_dense(name, self.cmap, rows, out)
        return out

    def _scatter_dense(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        """Write ``values`` [n, D] into the live chunks of ``rows`` (unique, all >= 0)."""
        self.chunks.scatter_dense(name, self.cmap, rows, np.ascontiguousarray(values, dtype=np.float32))

    def view(self, rows: np.ndarray) -> ChunkView:
        """The arrays, chunk map and rows the kernels use for a batch's ``rows`` (tiered: made resident)."""
        return self.chunks.view(self.cmap, rows)

    # ------------------------------------------------------------ forward / backward

    def pool(self, rows: np.ndarray, layout: BagLayout, *, train: bool, anchor: Tensor, fused: bool = True) -> Tensor:
        if fused:
            return pool_chunked(self, rows, layout, train, anchor)
        return pool_chunked_torch(self, rows, layout, train, anchor)

    def segments(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start [U], length [U]) of a batch's rows for the hot kernels (see kernels.row_segments)."""
        return segments(self.cmap, rows)

    def update(
        self, rows: Tensor, grad: Tensor, view: ChunkView | None = None, hits: np.ndarray | None = None, *,
        accesses: np.ndarray | None = None,
    ) -> None:
        """The fused optimizer on each live chunk of ``rows`` [U] from ``grad`` [U, D], and importance.

        ``view``: the rows' :meth:`view` from the forward, when the caller has it (tiered:
        the same fast-tier slots; they stay resident until the next lookup of the store).
        ``hits`` [U] float32: how many times the batch accessed each row (default once each);
        the access frequency the importance and the shrinkage's count are made of (``accesses``: the same).
        """
        hits = accesses if hits is None else hits
        self.step += 1
        cfg = self.optimizer
        r, g = rows.numpy(), grad.detach().contiguous().numpy()
        v = view if view is not None else self.view(r)
        hits = np.ones(r.shape[0], dtype=np.float32) if hits is None else np.ascontiguousarray(hits, dtype=np.float32)
        known = r[r >= 0]
        self.changes.changed(self.index.row_keys[known], self.index.row_tabs[known])
        if self.shrinkage:
            self.count[known] += hits[r >= 0]  # the rows of a batch are unique
        pw, cm, kr, st, ln, by = v.arrays["weights"], v.cmap, v.rows, v.start, v.length, self.by_grad
        bufs = self.chunks.update_buffers(v, r, self.next_imp, self.row_state)  # indexed as the view's kernels index
        imp, nxt, row_state = bufs
        lr, eps, wd = np.float32(cfg.lr), np.float32(cfg.eps), np.float32(cfg.weight_decay)
        kind, k = cfg.kind, self.kernels
        if kind is OptimizerKind.SGD:
            k.sgd(pw, cm, kr, st, ln, g, lr, wd, imp, nxt, by, hits)
        elif kind is OptimizerKind.ADAGRAD:
            k.adagrad(pw, v.arrays["sum"], cm, kr, st, ln, g, lr, eps, wd, imp, nxt, by, hits)
        elif kind is OptimizerKind.ROWWISE_ADAGRAD:
            k.rowwise_adagrad(pw, row_state["sum"].numpy(), cm, kr, st, ln, g, lr, eps, wd, self.dim, imp, nxt, by, hits)
        elif kind is OptimizerKind.ADAM:
            step_size = np.float32(adam_step_size(cfg, self.step))
            b1, b2 = np.float32(cfg.beta1), np.float32(cfg.beta2)
            k.adam(pw, v.arrays["exp_avg"], v.arrays["exp_avg_sq"], cm, kr, st, ln, g, step_size, b1, b2, eps, wd, imp, nxt, by, hits)
        else:  # pragma: no cover - enum is closed
            raise ValueError(kind)
        self.chunks.finish_update(v, r, bufs, self.next_imp, self.row_state)

    # ----------------------------------------------------------------- pruning

    def keep_scores(self, min_chunks: int, regrow: bool, margin: float, job_sum=None) -> np.ndarray:  # [n_rows, K] float32
        """``job_sum``: sums an array over the job's processes (the table means of the shrinkage are job-wide)."""
        out = np.empty((self.num_rows, self.n_pos), dtype=np.float32)
        imp, claim = self.shrunk_importance(job_sum) if self.shrinkage else (self.chunks.importance, self.next_imp)
        kernels.row_scores(self.cmap, self.num_rows, imp, claim, min_chunks, regrow, margin, out)
        return out

    def shrunk_importance(self, job_sum=None) -> tuple[np.ndarray, np.ndarray]:
        """Importance of every chunk and claim of every row, with the gradient magnitude shrunk.

        A chunk's importance ``S`` is the decayed sum of its gradient norms over its
        row's ``n`` (decayed) accesses, so ``S / n`` estimates its mean gradient
        magnitude; with few accesses that estimate is mostly label noise. With ``k``
        = ``prune.shrinkage`` and ``m`` its table's mean at that chunk position
        (sum of ``S`` over sum of ``n``), the score is ``n (S + k m) / (n + k)``:
        access frequency times a mean gradient magnitude that leans on the table's
        until the row has been seen about ``k`` times. Claims (``next_imp``, the
        first pruned position) get the same treatment.
        """
        n_rows, k = self.num_rows, np.float32(self.shrinkage)
        cmap = self.cmap[:n_rows]
        live = self.live_chunks()
        tabs = self.index.row_tabs[:n_rows].astype(np.int64)
        cnt = self.count[:n_rows]
        n_tab = len(self.tables)
        mask = cmap >= 0  # [n, K]: a prefix per row
        r_idx, q_idx = np.nonzero(mask)
        chunk = cmap[r_idx, q_idx].astype(np.int64)
        raw = self.chunks.importance
        cell = tabs[r_idx] * self.n_pos + q_idx  # (table, position) of each live chunk
        sums = np.bincount(cell, weights=raw[chunk], minlength=n_tab * self.n_pos)
        accesses = np.bincount(cell, weights=cnt[r_idx], minlength=n_tab * self.n_pos)
        if job_sum is not None:  # the table's mean over every process's rows
            sums, accesses = np.split(job_sum(np.concatenate([sums, accesses])), 2)
        mean = (sums / np.maximum(accesses, 1e-12)).astype(np.float32)  # [T * K]
        n = cnt[r_idx]
        imp = raw.copy()
        imp[chunk] = n * (raw[chunk] + k * mean[cell]) / (n + k)
        claim = self.next_imp.copy()
        part = np.flatnonzero(live < self.n_pos)
        if part.size:
            c = tabs[part] * self.n_pos + live[part]
            n = cnt[part]
            claim[part] = n * (self.next_imp[part] + k * mean[c]) / (n + k)
        return imp, claim

    def apply_counts(self, counts: np.ndarray) -> tuple[int, int]:
        """Set every row's chunk count to ``counts`` [n_rows] (each at most one more than now).

        A pruned chunk's importance becomes its row's claim to grow back; a chunk that
        grows back starts from zeros and fresh state, with that claim as its importance.
        Returns (chunks pruned, chunks regrown).
        """
        rows = np.arange(self.num_rows, dtype=np.int64)
        live = self.live_chunks()
        shrink = np.flatnonzero(counts < live)
        grow = np.flatnonzero(counts > live)
        if (counts[grow] > live[grow] + 1).any():
            raise ValueError("a row grows back at most one chunk per pruning step")
        moved = np.concatenate([shrink, grow])
        self.changes.changed(self.index.row_keys[moved], self.index.row_tabs[moved])
        if shrink.size:
            first = self.cmap[shrink, counts[shrink]]  # the first chunk each shrinking row loses
            self.next_imp[shrink] = self.chunks.importance[first]
        self._set_chunks(rows, counts)
        if grow.size:
            born = self.cmap[grow, live[grow]]
            self.chunks.importance[born] = self.next_imp[grow]
            self.next_imp[grow] = 0.0
        tabs = self.index.row_tabs[: self.num_rows]
        n = len(self.tables)
        lost = np.bincount(tabs[shrink], weights=(live - counts)[shrink], minlength=n).astype(np.int64)
        born_per_table = np.bincount(tabs[grow], minlength=n).astype(np.int64)
        self.pruned += lost
        self.regrown += born_per_table
        return int(lost.sum()), int(grow.size)

    def evict_empty_rows(self) -> int:
        """Forget the rows left with no chunk: their index entry, chunk map, claim and per-row state.

        Such a row reads as zeros, exactly as an unknown id; seen again in training it
        comes back as a new row. The other rows keep their order (they are renumbered).
        Returns the rows evicted.
        """
        n = self.num_rows
        live = self.live_chunks()
        keep = np.flatnonzero(live > 0)
        if keep.size == n:
            return 0
        self.evicted += np.bincount(self.index.row_tabs[:n][live == 0], minlength=len(self.tables))
        self._keep_rows(keep)
        return n - keep.size

    def _keep_rows(self, keep: np.ndarray) -> None:
        """Forget every row but ``keep`` (ascending row numbers; the others hold no chunk): their index
        entry, chunk map, claim and per-row state; the kept rows are renumbered in order."""
        n = self.num_rows
        tabs = self.index.row_tabs[:n]
        gone = np.ones(n, dtype=bool)
        gone[keep] = False
        self.changes.deleted(self.index.row_keys[:n][gone], tabs[gone])
        index = HashIndex(initial_rows=max(int(keep.size * 1.25), 16), n_tables=len(self.tables))
        if keep.size:
            index.lookup(self.index.row_keys[keep].copy(), tabs[keep].astype(np.int32), insert=True)
        cap, k = index.row_capacity, keep.size
        cmap = np.full((cap, self.n_pos), -1, dtype=np.int32)
        cmap[:k] = self.cmap[keep]
        next_imp = np.zeros(cap, dtype=np.float32)
        next_imp[:k] = self.next_imp[keep]
        if self.shrinkage:
            count = np.zeros(cap, dtype=np.float32)
            count[:k] = self.count[keep]
            self.count = count
        t = torch.from_numpy(keep)
        for name, st in self.row_state.items():
            fresh = torch.full((cap,), self.row_state_init[name])
            fresh[:k] = st[t]
            self.row_state[name] = fresh
        self.index, self.cmap, self.next_imp = index, cmap, next_imp

    def tie_keys(self) -> np.ndarray:  # [n_rows] uint64, a hash of (table, id): orders ties between rows
        n = self.num_rows
        out = np.empty(n, dtype=np.uint64)
        kernels.tie_keys(self.index.row_keys[:n], self.index.row_tabs[:n], out)
        return out

    def decay_importance(self, factor: float) -> None:
        """Every row's importance, claim and count times ``factor`` (``prune.decay``: a delta does not carry
        the rows changed by it alone; :meth:`catch_up` decays them as often on restore)."""
        self.chunks.importance *= np.float32(factor)
        self.next_imp[: self.num_rows] *= np.float32(factor)
        if self.shrinkage:
            self.count[: self.num_rows] *= np.float32(factor)
        self.decays += 1

    def compact(self) -> None:
        """Shrink the pool to its live chunks, each row's chunks one after another in row order.

        Rows laid out together take the hot kernels' flat path (kernels.row_segments).
        A tiered pool has nothing to compact: freed chunks left the tiers already.
        """
        n = self.num_rows
        sub = self.cmap[:n].copy()
        if self.chunks.compact_rows(sub, self.live_chunks()):
            self.cmap[:n] = sub

    def maybe_compact(self, over_budget: bool, free_fraction: float) -> bool:
        """Compact when the pool is mostly free (``free_fraction`` of it) or the job is over its budget."""
        pool = self.chunks
        if pool.num_free and (over_budget or pool.num_free >= free_fraction * pool.capacity):
            self.compact()
            return True
        return False

    # ----------------------------------------------------------- reporting

    def dim_histogram(self) -> np.ndarray:  # [K+1] rows with 0, c, 2c, ..., D dims
        return np.bincount(self.live_chunks(), minlength=self.n_pos + 1)

    def bytes_per_row(self) -> int:  # bytes of one full-dim row: weights, optimizer state, importance, count
        return self.n_pos * self.chunks.bytes_per_chunk() + 4 * self._row_floats()

    def pool_bytes(self) -> int:  # bytes the pool has allocated (what the budget limits)
        return self.chunks.nbytes()

    def value_bytes(self) -> int:  # bytes of the live chunks and the per-row optimizer state (no slack, no maps)
        return self.chunks.num_live * self.chunks.bytes_per_chunk() + self.row_state_bytes()

    def row_state_bytes(self) -> int:  # bytes of per-row state: optimizer (row-wise Adagrad), access count
        return self.num_rows * 4 * self._row_floats()

    def _row_floats(self) -> int:  # per-row floats the budget counts: optimizer state, access count
        return len(self.row_state) + (1 if self.shrinkage else 0)

    def full_value_bytes(self) -> int:
        """Bytes a plain TableGroup would hold for every row inserted (weights, optimizer state).

        Evicted rows count (an id evicted and inserted again counts twice: an upper bound).
        """
        per_dim = 1 + len(self.chunks.dim_state)
        return (self.num_rows + int(self.evicted.sum())) * 4 * (self.dim * per_dim + len(self.row_state))

    def nbytes(self) -> int:  # bytes allocated: pool, chunk maps, per-row state and claims, index
        rows = self.cmap.nbytes + self.next_imp.nbytes + self.count.nbytes + sum(s.numel() * 4 for s in self.row_state.values())
        return self.chunks.ram_bytes() + rows + self.index.nbytes()

    def resident_nbytes(self) -> int:
        return self.nbytes()

    def chunk_bytes(self) -> int:  # bytes of one chunk: weights, per-dim state, importance
        return self.chunks.bytes_per_chunk()

    def row_bytes(self) -> int:  # bytes of per-row state a row keeps while it keeps any chunk
        return 4 * self._row_floats()

    def tier_stores(self) -> list:
        return self.chunks.tier_stores()

    def prefetcher(self) -> Prefetching | None:
        """The read-ahead of the chunks of upcoming batches' rows, where they live in tiers with a disk (else None)."""
        return self.chunks.prefetcher(self.chunks_of)

    def chunks_of(self, keys: np.ndarray, tabs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(live chunk numbers [n], the position in ``keys`` of each one's row) of the known (table, id) pairs
        (unknown ones have none); moves nothing."""
        rows = self.index.lookup(keys, tabs.astype(np.int32, copy=False), insert=False).rows
        known = np.flatnonzero(rows >= 0)
        cm = self.cmap[rows[known]]  # [n_known, K]
        live = cm >= 0
        return cm[live].astype(np.int64), np.repeat(known, live.sum(axis=1))

    def pruning(self) -> PrunedGroup:
        return self

    def empty_in_memory(self) -> PrunedGroup:
        """An empty group of the same tables, pruning config, seed and device, its chunks in memory (a hot-row
        replica: rows with their own dims)."""
        return PrunedGroup(self.tables, self.cfg, seed=self.seed, device=self.device)

    # ------------------------------------------------------------------- state

    def records(self, t: int, rows: np.ndarray) -> dict[str, Tensor]:
        """Records of ``rows`` (all of table ``t``) with their own dims, compactly.

        ``ids`` [n], ``dims`` [n] int32, ``chunked.weights`` [sum(dims)] (each row's
        prefix, rows in order), ``chunked.opt.<name>`` likewise for per-dim state,
        ``opt.<name>`` [n] per-row state, ``chunked.importance`` [sum(dims)/c],
        ``next_importance`` [n], ``access_count`` [n].
        """
        ids = self.index.row_keys[rows]
        live = self.live_chunks(rows)
        dmask = np.arange(self.dim) < (live * self.chunk)[:, None]  # [n, D]
        cmask = np.arange(self.n_pos) < live[:, None]  # [n, K]
        out = {
            "ids": torch.from_numpy(ids),
            "dims": torch.from_numpy((live * self.chunk).astype(np.int32)),
            "chunked.weights": torch.from_numpy(self._gather_dense("weights", rows)[dmask]),
            "chunked.importance": torch.from_numpy(self.chunks.importance[self.cmap[rows][cmask]].copy()),
            "next_importance": torch.from_numpy(self.next_imp[rows].copy()),
            "access_count": torch.from_numpy(self.count[rows].copy() if self.shrinkage else np.zeros(rows.shape[0], np.float32)),
        }
        for n in self.chunks.dim_state:
            out[f"chunked.opt.{n}"] = torch.from_numpy(self._gather_dense(n, rows)[dmask])
        for n, s in self.row_state.items():
            out[f"opt.{n}"] = s[torch.from_numpy(rows)].clone()
        return out

    def table_meta(self, t: int) -> dict[str, Tensor]:
        """``pruned_chunks`` / ``regrown_chunks`` / ``evicted_rows`` counters of table ``t``."""
        return {
            "pruned_chunks": torch.tensor(int(self.pruned[t])),
            "regrown_chunks": torch.tensor(int(self.regrown[t])),
            "evicted_rows": torch.tensor(int(self.evicted[t])),
            "importance_decays": torch.tensor(int(self.decays[t])),
        }

    def load_table_meta(self, t: int, sd: dict[str, Tensor]) -> None:
        if "pruned_chunks" in sd:
            self.pruned[t] = int(sd["pruned_chunks"])
            self.regrown[t] = int(sd["regrown_chunks"])
            self.evicted[t] = int(sd["evicted_rows"])
        if "importance_decays" in sd:
            self.decays[t] = int(sd["importance_decays"])

    def write_records(self, t: int, sd: dict[str, Tensor]) -> None:
        """Insert (or overwrite) rows from ``records`` output; a TableGroup's (full-dim) records load too."""
        ids = sd["ids"].numpy().astype(np.int64, copy=False)
        tabs = np.full(ids.shape[0], t, dtype=np.int32)
        rows = self.lookup(ids, tabs, insert=True).numpy()
        self.changes.changed(ids, tabs)
        dense = "weights" in sd  # a plain TableGroup's state: every row at full dim
        dims = np.full(ids.shape[0], self.dim) if dense else sd["dims"].numpy().astype(np.int64)
        self._set_chunks(rows, dims // self.chunk)
        dmask = np.arange(self.dim) < dims[:, None]
        for name, array in [("weights", "weights"), *[(f"opt.{n}", n) for n in self.chunks.dim_state]]:
            if dense:
                values = sd[name].numpy()
            else:
                values = np.zeros((rows.shape[0], self.dim), dtype=np.float32)
                values[dmask] = sd[f"chunked.{name}"].numpy()
            self._scatter_dense(array, rows, values)
        for n, s in self.row_state.items():
            s[torch.from_numpy(rows)] = sd[f"opt.{n}"]
        cmask = np.arange(self.n_pos) < (dims // self.chunk)[:, None]
        if dense:
            self.chunks.importance[self.cmap[rows][cmask]] = 0.0
            self.next_imp[rows] = 0.0
        else:
            self.chunks.importance[self.cmap[rows][cmask]] = sd["chunked.importance"].numpy()
            self.next_imp[rows] = sd["next_importance"].numpy()
            if self.shrinkage and "access_count" in sd:
                self.count[rows] = sd["access_count"].numpy()

    # Checkpoints stream a table's rows in bounded chunks (tierec/embedding/group.py's scheme).

    def row_extent(self) -> int:
        """Row numbers in use lie in ``[0, row_extent())``."""
        return self.index.num_rows

    def rows_of(self, t: int, lo: int, hi: int) -> np.ndarray:
        """Rows [n] int64 of table ``t`` among row numbers ``[lo, hi)``, ascending."""
        return lo + np.flatnonzero(self.index.row_tabs[lo:hi] == t)

    # ------------------------------------------------------------------- records

    def records_of(self, keys: np.ndarray, tabs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found [n], records [n, record_width]): full-dim weights and per-dim state (zeros past each
        row's dims), per-row state, then the row's dims."""
        rows = self.index.lookup(keys, tabs.astype(np.int32, copy=False), insert=False).rows
        found = rows >= 0
        out = np.zeros((keys.shape[0], self.record_width), dtype=np.float32)
        r = rows[found]
        if r.size:
            parts = [self._gather_dense("weights", r)] + [self._gather_dense(n, r) for n in self.chunks.dim_state]
            parts += [s[torch.from_numpy(r)].numpy()[:, None] for s in self.row_state.values()]
            parts.append((self.live_chunks(r) * self.chunk).astype(np.float32)[:, None])
            out[found] = np.concatenate(parts, axis=1)
        return found, out

    def put_records(self, keys: np.ndarray, tabs: np.ndarray, records: np.ndarray) -> None:
        rows = self.lookup(keys, tabs.astype(np.int32, copy=False), insert=True).numpy()
        self.changes.changed(keys, tabs)
        rec = np.ascontiguousarray(records, dtype=np.float32)
        self._set_chunks(rows, rec[:, -1].astype(np.int64) // self.chunk)
        col = 0
        for name in ["weights", *self.chunks.dim_state]:
            self._scatter_dense(name, rows, rec[:, col : col + self.dim])
            col += self.dim
        for s in self.row_state.values():
            s[torch.from_numpy(rows)] = torch.from_numpy(rec[:, col].copy())
            col += 1

    # ------------------------------------------------------------ importance by (table, id)

    @property
    def importance_width(self) -> int:  # floats per row of importance_of: each position, the claim, (the count)
        return self.n_pos + 1 + (1 if self.shrinkage else 0)

    def importance_of(self, keys: np.ndarray, tabs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found [n], [n, importance_width]): what the pruner scores a row by, by (table, id): each live
        chunk's importance (zeros past the row's dims), the claim to grow back, the decayed access count
        (with shrinkage). Every part adds up over the batches a row served (cross-group sums use that)."""
        rows = self.index.lookup(keys, tabs.astype(np.int32, copy=False), insert=False).rows
        found = rows >= 0
        out = np.zeros((keys.shape[0], self.importance_width), dtype=np.float32)
        r = rows[found]
        if r.size:
            cm = self.cmap[r]  # [n, K]
            live = cm >= 0
            imp = np.zeros(cm.shape, dtype=np.float32)
            imp[live] = self.chunks.importance[cm[live]]
            parts = [imp, self.next_imp[r][:, None]] + ([self.count[r][:, None]] if self.shrinkage else [])
            out[found] = np.concatenate(parts, axis=1)
        return found, out

    def put_importance(self, keys: np.ndarray, tabs: np.ndarray, values: np.ndarray) -> None:
        """Set the importance of the known rows of (keys, tabs) from ``importance_of``'s layout (values past a
        row's dims are ignored)."""
        rows = self.index.lookup(keys, tabs.astype(np.int32, copy=False), insert=False).rows
        ok = rows >= 0
        r, v = rows[ok], np.asarray(values, dtype=np.float32)[ok]
        if not r.size:
            return
        self.changes.changed(np.asarray(keys)[ok], np.asarray(tabs)[ok])
        cm = self.cmap[r]
        live = cm >= 0
        self.chunks.importance[cm[live]] = v[:, : self.n_pos][live]
        self.next_imp[r] = v[:, self.n_pos]
        if self.shrinkage:
            self.count[r] = v[:, self.n_pos + 1]

    # ------------------------------------------------------ delta checkpoints (tierec/embedding/changes.py)

    def record_rows(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:
        """Rows of known ``(table, id)`` pairs (-1: unknown); moves nothing."""
        return self.index.lookup(keys, tabs.astype(np.int32, copy=False), insert=False).rows

    def delete_records(self, keys: np.ndarray, tabs: np.ndarray) -> None:
        """Forget the rows of the known ``(table, id)`` pairs (a delta's rows evicted at dim 0)."""
        rows = self.record_rows(np.asarray(keys, dtype=np.int64), np.asarray(tabs, dtype=np.int32))
        rows = np.unique(rows[rows >= 0])
        if rows.size:
            self._set_chunks(rows, np.zeros(rows.size, dtype=np.int64))
            self._keep_rows(np.setdiff1d(np.arange(self.num_rows, dtype=np.int64), rows))

    def catch_up(self, t: int, sd: dict[str, Tensor]) -> None:
        """Decay the rows of table ``t`` as often as the run did by the delta's ``sd`` (its ``table_meta``):
        rows the delta does not carry changed by the decay alone (the carried ones are overwritten)."""
        times = int(sd["importance_decays"]) - int(self.decays[t]) if "importance_decays" in sd else 0
        if times <= 0:
            return
        rows = self.rows_of(t, 0, self.row_extent())
        chunks = self.cmap[rows]
        chunks = chunks[chunks >= 0]
        f = np.float32(self.cfg.decay)
        for _ in range(times):  # one multiplication per decay, as in the run: bitwise the same
            self.chunks.importance[chunks] *= f
            self.next_imp[rows] *= f
            if self.shrinkage:
                self.count[rows] *= f
        self.decays[t] += times

    def close(self) -> None:
        """Close the tiered pool's disk file (a no-op in memory)."""
        self.chunks.close()


def chunk_store_name(tables: list[TableConfig]) -> str:  # the chunk store's name in store statistics
    return f"{tables[0].name}.chunks" if len(tables) == 1 else f"{tables[0].name}+{len(tables) - 1}.chunks"
