"""Row order and hash splits: a streaming shuffle and stable split buckets.

Shuffling streams: the source's rows are cut into chunks (a range of file rows,
a shard's record batch, a range of synthetic rows) whose order is permuted per
epoch, and the rows pass through a shuffle buffer of ``buffer_rows``. Everything
is drawn from ``numpy.random.default_rng([seed, epoch, ...])``, so an epoch's
order is a pure function of ``(seed, epoch)``: a resumed run regenerates it and
skips the rows already trained on, and sees the same rows as an uninterrupted one.

A hash split puts a row in train, validation or test by a 64-bit hash of a key,
mapped to [0, 1): the row's number in the file, or the id of a chosen
categorical column (all rows of one user land in one split). The buckets do not
depend on the batch size, the seed or the order of reading.

>>> import numpy as np
>>> from tierec.data.blocks import RowBlock
>>> blk = RowBlock.from_ids(np.arange(10, dtype=np.float32), np.zeros((10, 0), np.float32), np.arange(10)[None, :])
>>> out = list(shuffle_buffer([blk], buffer_rows=4, rng=np.random.default_rng(0)))
>>> sorted(np.concatenate([b.labels for b in out]).tolist()) == list(range(10))
True
>>> u = hash_unit(np.arange(100_000, dtype=np.int64))
>>> bool(0.09 < ((u >= 0.1) & (u < 0.2)).mean() < 0.11)
True
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from tierec.data.blocks import RowBlock, concat_slices

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
SPLIT_SALT = 0x5B1D_5EED  # hash splits never collide with the id hashing of the readers


@dataclass(frozen=True)
class Shuffle:
    """The training order of one epoch: ``seed`` (train.seed) and ``epoch``."""

    seed: int
    epoch: int
    buffer_rows: int = 65536
    chunk_rows: int = 65536

    def rng(self) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch, 0x5EED])


def hash_unit(keys: np.ndarray, salt: int = SPLIT_SALT) -> np.ndarray:
    """A stable hash of int64 ``keys`` [n] to [0, 1) float64 (splitmix64 finaliser)."""
    with np.errstate(over="ignore"):
        z = keys.astype(np.int64).view(np.uint64) + np.uint64(salt) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class HashSplit:
    """Rows whose key hashes into ``[lo, hi)``; the key is the file row, or feature ``feature``'s id."""

    lo: float
    hi: float
    feature: int = -1  # index among the categorical features; -1 = the row number

    def keep(self, block: RowBlock) -> np.ndarray:
        """[n] bool: the block's rows that belong to the split."""
        if self.feature < 0:
            if block.rows is None:
                raise ValueError("a row-hash split needs the file rows of the block")
            keys = block.rows
        else:
            keys = block.feature(self.feature)[0]  # one id per row (checked when the split is made)
        u = hash_unit(keys)
        return (u >= self.lo) & (u < self.hi)

    def count_rows(self, n: int, chunk: int = 1 << 22) -> int:
        """Rows of a file of ``n`` rows in the split (exact for a row hash; expected for a column hash)."""
        if self.feature >= 0:
            return int(round(n * (self.hi - self.lo)))
        total = 0
        for a in range(0, n, chunk):
            u = hash_unit(np.arange(a, min(a + chunk, n), dtype=np.int64))
            total += int(np.count_nonzero((u >= self.lo) & (u < self.hi)))
        return total


def chunk_ranges(first: int, stop: int, chunk_rows: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """``[first, stop)`` cut into ranges of ``chunk_rows``, in a random order."""
    ranges = [(a, min(a + chunk_rows, stop)) for a in range(first, stop, chunk_rows)]
    return [ranges[i] for i in rng.permutation(len(ranges))]


def shuffle_buffer(blocks: Iterable[RowBlock], buffer_rows: int, rng: np.random.Generator) -> Iterator[RowBlock]:
    """The rows of ``blocks`` through a shuffle buffer: arriving blocks join the pool; once it holds
    twice ``buffer_rows``, it is permuted and all but ``buffer_rows`` rows leave (so each row is copied
    a constant number of times); the rest leave permuted at the end."""
    pool: RowBlock | None = None
    for blk in blocks:
        if blk.size == 0:
            continue
        pool = blk if pool is None else concat_slices([(pool, 0, pool.size), (blk, 0, blk.size)])
        if pool.size >= 2 * buffer_rows:
            mixed = pool.select(rng.permutation(pool.size))
            out = pool.size - buffer_rows
            yield concat_slices([(mixed, 0, out)])
            pool = concat_slices([(mixed, out, mixed.size)])
    if pool is not None and pool.size:
        yield pool.select(rng.permutation(pool.size))
