"""Row blocks: the numpy form of a run of rows, and re-batching them into Batches.

Readers produce :class:`RowBlock` s of whatever size their input comes in (an
Arrow record batch, a shard's record batch, a synthetic batch); :func:`rebatch`
cuts and joins them into blocks of exactly ``batch_size`` rows (the last may be
short), skipping a number of leading rows for resume; :func:`to_batch` wraps a
block as a :class:`~tierec.batch.Batch` without copying. Sparse ids are packed
feature-major like :class:`~tierec.batch.SparseFeatures`.

>>> import numpy as np
>>> blk = RowBlock.from_ids(np.array([1.0, 0.0, 1.0], np.float32), np.zeros((3, 2), np.float32),
...                        np.array([[10, 11, 12], [20, 21, 22]]))  # ids [F, n]
>>> [b.size for b in rebatch([blk, blk], batch_size=4)]
[4, 2]
>>> to_batch(next(rebatch([blk, blk], 4, skip_rows=2)), ("a", "b")).sparse["b"].values.tolist()
[22, 20, 21, 22]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from tierec.batch import Batch, SparseFeatures


@dataclass(frozen=True)
class RowBlock:
    """Rows ``0..n-1`` of F sparse features; bag ``f * n + i`` is feature f of row i."""

    labels: np.ndarray  # [n] float32
    dense: np.ndarray  # [n, n_dense] float32
    values: np.ndarray  # [N] int64, feature-major
    offsets: np.ndarray  # [F * n + 1] int64
    n_features: int
    one_hot: bool = False  # every bag holds exactly one id (offsets == arange)
    rows: np.ndarray | None = None  # [n] int64 0-based data row of the file each row came from (files only)
    order: np.ndarray | None = None  # [n] float64 value of the split column (a column split's file blocks only)

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])

    @staticmethod
    def from_ids(labels: np.ndarray, dense: np.ndarray, ids: np.ndarray) -> RowBlock:
        """From ``ids`` [F, n] int64 (one id per feature per row)."""
        f, n = ids.shape
        values = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        return RowBlock(labels, dense, values, np.arange(f * n + 1, dtype=np.int64), f, one_hot=True)

    @staticmethod
    def from_features(labels: np.ndarray, dense: np.ndarray, features: list[tuple[np.ndarray, np.ndarray | None]]) -> RowBlock:
        """From per-feature ``(values, lengths)``; ``lengths`` None means one id per row."""
        n = labels.shape[0]
        if all(lengths is None for _, lengths in features):
            ids = np.stack([v for v, _ in features]) if features else np.empty((0, n), np.int64)
            return RowBlock.from_ids(labels, dense, ids)
        lengths_all = np.empty((len(features), n), np.int64)  # [F, n]
        for f, (_, lengths) in enumerate(features):
            lengths_all[f] = 1 if lengths is None else lengths
        offsets = np.zeros(len(features) * n + 1, np.int64)
        np.cumsum(lengths_all.reshape(-1), out=offsets[1:])
        values = np.concatenate([v for v, _ in features]).astype(np.int64, copy=False)
        return RowBlock(labels, dense, values, offsets, len(features))

    def feature(self, f: int) -> tuple[np.ndarray, np.ndarray]:
        """Values [N_f] and lengths [n] of feature ``f``."""
        n = self.size
        off = self.offsets[f * n : (f + 1) * n + 1]
        return self.values[off[0] : off[-1]], np.diff(off)

    def with_rows(self, rows: np.ndarray | None) -> RowBlock:
        """The same block tagged with the file rows it came from."""
        return dataclasses.replace(self, rows=rows)

    def with_order(self, order: np.ndarray | None) -> RowBlock:
        """The same block with its rows' split-column values."""
        return dataclasses.replace(self, order=order)

    def with_labels(self, labels: np.ndarray) -> RowBlock:
        """The same rows with other labels [n] float32."""
        return dataclasses.replace(self, labels=labels)

    def with_feature_ids(self, f: int, ids: np.ndarray) -> RowBlock:
        """The same rows with feature ``f``, one id per row, replaced by ``ids`` [n] int64 (a new values array)."""
        n = self.size
        start, stop = int(self.offsets[f * n]), int(self.offsets[(f + 1) * n])
        single = self.one_hot or bool(np.all(np.diff(self.offsets[f * n : (f + 1) * n + 1]) == 1))
        if not single or ids.shape != (n,):
            raise ValueError(f"feature {f} must hold one id per row to be replaced")
        values = self.values.copy()
        values[start:stop] = ids
        return dataclasses.replace(self, values=values)

    def select(self, keep: np.ndarray) -> RowBlock:
        """The rows where ``keep`` [n] bool is true, or at the indices ``keep`` [m] int, in that order."""
        n, nf = self.size, self.n_features
        rows = None if self.rows is None else self.rows[keep]
        order = None if self.order is None else self.order[keep]
        if self.one_hot:
            ids = self.values.reshape(nf, n)[:, keep]
            return RowBlock.from_ids(self.labels[keep], self.dense[keep], ids).with_rows(rows).with_order(order)
        if keep.dtype != np.bool_:  # indices (a permutation or a subset)
            return self._gather(keep, rows).with_order(order)
        lengths = np.diff(self.offsets).reshape(nf, n)  # [F, n]
        bag_keep = np.repeat(np.broadcast_to(keep, (nf, n)).reshape(-1), lengths.reshape(-1))
        kept = lengths[:, keep]
        offsets = np.zeros(kept.size + 1, np.int64)
        np.cumsum(kept.reshape(-1), out=offsets[1:])
        return RowBlock(self.labels[keep], self.dense[keep], self.values[bag_keep], offsets, nf, rows=rows, order=order)


    def _gather(self, idx: np.ndarray, rows: np.ndarray | None) -> RowBlock:
        n, nf = self.size, self.n_features
        starts = self.offsets[:-1].reshape(nf, n)[:, idx].reshape(-1)  # [F * m]
        lens = np.diff(self.offsets).reshape(nf, n)[:, idx].reshape(-1)  # [F * m]
        offsets = np.zeros(lens.size + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        within = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], lens)
        values = self.values[np.repeat(starts, lens) + within]
        return RowBlock(self.labels[idx], self.dense[idx], values, offsets, nf, rows=rows)


def concat_slices(pieces: list[tuple[RowBlock, int, int]]) -> RowBlock:
    """Rows ``a:b`` of each ``(block, a, b)``, joined in order."""
    first, a0, b0 = pieces[0]
    nf = first.n_features
    if len(pieces) == 1 and a0 == 0 and b0 == first.size:
        return first
    labels = np.concatenate([blk.labels[a:b] for blk, a, b in pieces])  # [m]
    dense = np.concatenate([blk.dense[a:b] for blk, a, b in pieces])  # [m, n_dense]
    rows = None
    if all(blk.rows is not None for blk, _, _ in pieces):
        rows = np.concatenate([blk.rows[a:b] for blk, a, b in pieces])  # type: ignore[index]
    if all(blk.one_hot for blk, _, _ in pieces):
        ids = np.concatenate([blk.values.reshape(nf, blk.size)[:, a:b] for blk, a, b in pieces], axis=1)
        return RowBlock.from_ids(labels, dense, ids).with_rows(rows)
    offs = []  # per piece [F, b - a + 1]: the piece's bag boundaries, feature by feature
    for blk, a, b in pieces:
        idx = np.arange(nf, dtype=np.int64)[:, None] * blk.size + np.arange(a, b + 1, dtype=np.int64)[None, :]
        offs.append(blk.offsets[idx])
    lengths = np.concatenate([np.diff(o, axis=1) for o in offs], axis=1)  # [F, m]
    offsets = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths.reshape(-1), out=offsets[1:])
    segments = [blk.values[o[f, 0] : o[f, -1]] for f in range(nf) for (blk, _, _), o in zip(pieces, offs)]
    values = np.concatenate(segments) if segments else np.empty(0, np.int64)
    return RowBlock(labels, dense, values, offsets, nf, rows=rows)


def rebatch(blocks: Iterable[RowBlock], batch_size: int, skip_rows: int = 0, drop_last: bool = False) -> Iterator[RowBlock]:
    """Blocks of exactly ``batch_size`` rows (the last may be short unless ``drop_last``)."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    pending: list[tuple[RowBlock, int, int]] = []
    have = 0
    for blk in blocks:
        n = blk.size
        a = min(skip_rows, n)
        skip_rows -= a
        while a < n:
            take = min(batch_size - have, n - a)
            pending.append((blk, a, a + take))
            have += take
            a += take
            if have == batch_size:
                yield concat_slices(pending)
                pending, have = [], 0
    if pending and not drop_last:
        yield concat_slices(pending)


def skip_rows(blocks: Iterable[RowBlock], n: int) -> Iterator[RowBlock]:
    """The blocks without their first ``n`` rows in total."""
    for blk in blocks:
        if n >= blk.size:
            n -= blk.size
            continue
        yield concat_slices([(blk, n, blk.size)]) if n else blk
        n = 0


def _tensor(a: np.ndarray) -> torch.Tensor:
    a = np.ascontiguousarray(a)
    if not a.flags.writeable:  # memory-mapped shards: torch wants writable memory
        a = a.copy()
    return torch.from_numpy(a)


def to_batch(block: RowBlock, keys: tuple[str, ...]) -> Batch:
    """Wrap a block as a Batch (no copy when the arrays are already contiguous)."""
    sparse = SparseFeatures(keys, _tensor(block.values), _tensor(block.offsets), block.size)
    return Batch(dense=_tensor(block.dense), sparse=sparse, labels=_tensor(block.labels))


def from_batch(batch: Batch) -> RowBlock:
    """The block of a Batch (shares memory with it)."""
    sp = batch.sparse
    n, nf = batch.size, len(sp.keys)
    one_hot = sp.values.numel() == n * nf and bool(torch.equal(sp.offsets, torch.arange(n * nf + 1)))
    return RowBlock(batch.labels.numpy(), batch.dense.numpy(), sp.values.numpy(), sp.offsets.numpy(), nf, one_hot)
