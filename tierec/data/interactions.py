"""Who used what: one streaming pass over a split's rows for sampled negatives (``data.negatives``).

:meth:`Interactions.scan` reads a split's :class:`~tierec.data.blocks.RowBlock` s once
and keeps, whatever the file's size, only:

- ``pairs`` [P] uint64: a 64-bit hash of every distinct (user, item) pair, sorted
  (8 bytes per pair; :meth:`Interactions.has` answers "has this user this item?" by
  binary search; two pairs sharing a hash, about P² / 2^65 of them, only forbid a
  negative that was allowed);
- ``items`` [I] int64 and ``counts`` [I] int64: the distinct item ids, sorted, and the
  rows of each (16 bytes per item), what negatives are drawn from;
- ``attributes`` [I, A] int64: the ids of the item's ``data.item_features`` columns in
  its first row (8 bytes per item and column);
- ``rows`` and ``positives``: rows read, and those that are positives.

Blocks are reduced as they come and merged into the sorted arrays every
:data:`MERGE_ROWS` pending entries, so the pass holds those arrays plus at most
about that many pending entries (a merge briefly needs two to three times the
arrays).

>>> import numpy as np
>>> from tierec.data.blocks import RowBlock
>>> ids = np.array([[1, 1, 2, 2], [10, 11, 10, 10]])  # [F, n]: users, items
>>> blk = RowBlock.from_ids(np.ones(4, np.float32), np.zeros((4, 0), np.float32), ids)
>>> seen = Interactions.scan([blk], ColumnRoles(user=0, item=1))
>>> seen.items.tolist(), seen.counts.tolist(), seen.rows, seen.has(np.array([1, 1, 2]), np.array([10, 12, 11])).tolist()
([10, 11], [3, 1], 4, [True, False, False])
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tierec.data.blocks import RowBlock

MERGE_ROWS = 1 << 22  # pending (user, item) entries before they are merged into the sorted arrays
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_PAIR_SALT = np.uint64(0x1A7E_5EED_0F_A1B5)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over uint64 [n]: a bijection whose outputs look independent."""
    with np.errstate(over="ignore"):
        x = x.astype(np.uint64, copy=True)
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
    return x


def pair_keys(users: np.ndarray, items: np.ndarray) -> np.ndarray:
    """[n] uint64: one hash of each (user id, item id) pair (int64 [n] each)."""
    with np.errstate(over="ignore"):
        return mix64(mix64(users.view(np.uint64) ^ _PAIR_SALT) + items.view(np.uint64) * GOLDEN)


@dataclass(frozen=True)
class ColumnRoles:
    """Where the user, the item and the item's own columns are among a block's features."""

    user: int
    item: int
    attributes: tuple[int, ...] = ()  # data.item_features, in order
    keep_label: bool = False  # positives are the rows labelled 1 (else every row is one)


@dataclass(frozen=True)
class Interactions:
    """The (user, item) pairs and item counts of one split (see the module docstring)."""

    pairs: np.ndarray  # [P] uint64 sorted, distinct
    items: np.ndarray  # [I] int64 sorted, distinct
    counts: np.ndarray  # [I] int64 rows per item
    attributes: np.ndarray  # [I, A] int64 the item's columns in its first row
    rows: int
    positives: int

    @property
    def nbytes(self) -> int:
        return int(self.pairs.nbytes + self.items.nbytes + self.counts.nbytes + self.attributes.nbytes)

    def has(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """[n] bool: whether each user (int64 [n]) has the item (int64 [n]) in this split."""
        if self.pairs.size == 0:
            return np.zeros(users.shape[0], bool)
        keys = pair_keys(users, items)
        at = np.minimum(np.searchsorted(self.pairs, keys), self.pairs.size - 1)
        return self.pairs[at] == keys

    @staticmethod
    def scan(blocks: Iterable[RowBlock], roles: ColumnRoles) -> Interactions:
        """One pass over ``blocks``: their pairs, items, counts and item columns."""
        acc = _Accumulator(len(roles.attributes))
        for blk in blocks:
            if blk.size:
                acc.add(blk, roles)
        return acc.finish()


@dataclass(frozen=True)
class ItemPool:
    """Items to draw negatives from: distinct ids (sorted), their rows, their item-feature ids."""

    items: np.ndarray  # [I] int64 sorted, distinct
    counts: np.ndarray  # [I] int64
    attributes: np.ndarray  # [I, A] int64

    @staticmethod
    def of(seen: Interactions) -> ItemPool:
        return ItemPool(seen.items, seen.counts, seen.attributes)

    def union(self, other: ItemPool) -> ItemPool:
        """Both pools' items, their counts summed, an item's attributes this pool's where it has the item."""
        items, first, inverse = np.unique(np.concatenate([self.items, other.items]), return_index=True, return_inverse=True)
        counts = np.bincount(inverse.reshape(-1), weights=np.concatenate([self.counts, other.counts]), minlength=items.size)
        return ItemPool(items, counts.astype(np.int64), np.concatenate([self.attributes, other.attributes])[first])


class _Accumulator:
    """The sorted arrays so far, and the blocks' reduced entries not merged into them yet."""

    def __init__(self, n_attributes: int) -> None:
        self.pairs = np.empty(0, np.uint64)
        self.items = np.empty(0, np.int64)
        self.counts = np.empty(0, np.int64)
        self.attributes = np.empty((0, n_attributes), np.int64)
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # (pairs, items, counts, attrs)
        self.pending_rows = 0
        self.rows = 0
        self.positives = 0

    def add(self, blk: RowBlock, roles: ColumnRoles) -> None:
        users, items = blk.feature(roles.user)[0], blk.feature(roles.item)[0]
        attrs = np.stack([blk.feature(f)[0] for f in roles.attributes], axis=1) if roles.attributes else np.empty((blk.size, 0), np.int64)
        self.rows += blk.size
        self.positives += int(np.count_nonzero(blk.labels >= 0.5)) if roles.keep_label else blk.size
        uniq, first, counts = np.unique(items, return_index=True, return_counts=True)
        self.pending.append((np.unique(pair_keys(users, items)), uniq, counts.astype(np.int64), attrs[first]))
        self.pending_rows += blk.size
        if self.pending_rows >= MERGE_ROWS:
            self._merge()

    def _merge(self) -> None:
        if not self.pending:
            return
        self.pairs = np.unique(np.concatenate([self.pairs, *(p[0] for p in self.pending)]))
        items = np.concatenate([self.items, *(p[1] for p in self.pending)])
        counts = np.concatenate([self.counts, *(p[2] for p in self.pending)])
        attrs = np.concatenate([self.attributes, *(p[3] for p in self.pending)])
        # np.unique's index is each item's first place: the merged arrays come first, then blocks in order
        self.items, first, inverse = np.unique(items, return_index=True, return_inverse=True)
        self.counts = np.bincount(inverse.reshape(-1), weights=counts, minlength=self.items.size).astype(np.int64)
        self.attributes = attrs[first]
        self.pending, self.pending_rows = [], 0

    def finish(self) -> Interactions:
        self._merge()
        return Interactions(self.pairs, self.items, self.counts, self.attributes, self.rows, self.positives)
