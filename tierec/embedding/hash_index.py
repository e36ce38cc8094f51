"""HashIndex: a growing, collision-free map from (table, 64-bit id) to row number.

Rows are numbered densely in insertion order, so a table's weights live in one
contiguous ``[rows, dim]`` tensor. The map is open addressing with linear
probing; a slot holds an int32 row number, with 4 bits of the key's hash above
it while the group has at most 134M rows (a slot whose bits differ is passed
over without reading its row's id), and the key is confirmed against the row's
own id and table, so the index costs 8 bytes of id plus
1 byte of table (2 beyond 127 tables) per row, plus 4 bytes per slot. The slot
array can have any size (a multiply-shift maps a hash onto it), so it is kept
between 50 % and 80 % full: 5 to 8 bytes per row, where power-of-two sizes at
the same maximum load swing between 5 and 10 (a rebuild always doubles them).

>>> import numpy as np
>>> from tierec.embedding.hash_index import HashIndex
>>> idx = HashIndex()
>>> r = idx.lookup(np.array([7, 9, 7], dtype=np.int64), np.zeros(3, dtype=np.int32), insert=True)
>>> r.rows.tolist(), r.new.tolist()
([0, 1, 0], [0, 1])
>>> idx.num_rows
2
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tierec.embedding import kernels
from tierec.embedding.arena import GrowableArray, resident_bytes

MAX_LOAD = 0.8  # rebuild the slot array when it would be fuller than this ...
REBUILD_LOAD = 0.5  # ... into one this full
MAX_SLOTS = (1 << 32) - 1  # kernels.home_slot scales a 32-bit hash
TAG_BITS = 4  # hash bits kept above the row number in each slot ...
TAGGED_ROWS = 1 << (31 - TAG_BITS)  # ... while rows fit in the rest (134M); beyond, slots hold bare rows


@dataclass(frozen=True)
class Lookup:
    rows: np.ndarray  # [N] int64 row of each queried pair, -1 if absent
    new: np.ndarray  # [n_new] int64 positions (into the query) of pairs inserted by this call


def _next_pow2(n: int) -> int:  # the per-batch Deduper's scratch table (kernels.dedupe masks its hash)
    return 1 << max(4, int(n - 1).bit_length())


def _slots_for(rows: int, load: float) -> int:
    n = max(16, int(rows / load) + 1)
    if n > MAX_SLOTS:
        raise ValueError(f"a HashIndex holds at most {int(MAX_SLOTS * MAX_LOAD):,} rows; split the tables into more groups")
    return n


def table_dtype(n_tables: int) -> np.dtype:
    """Narrowest signed integer holding table numbers 0 .. n_tables - 1."""
    if n_tables <= np.iinfo(np.int8).max + 1:
        return np.dtype(np.int8)
    if n_tables <= np.iinfo(np.int16).max + 1:
        return np.dtype(np.int16)
    raise ValueError(f"a HashIndex holds at most {np.iinfo(np.int16).max + 1} tables, got {n_tables}")


class HashIndex:
    def __init__(self, initial_rows: int = 1024, n_tables: int = 1 << 15) -> None:
        self.num_rows = 0
        # Row arrays grow without copying or touching their spare capacity (arena.GrowableArray).
        self._keys = GrowableArray(np.zeros(initial_rows, dtype=np.int64))
        self._tabs = GrowableArray(np.zeros(initial_rows, dtype=table_dtype(n_tables)))
        self.row_keys = self._keys.array  # [R] id of each row
        self.row_tabs = self._tabs.array  # [R] table of each row
        self.tag_bits = TAG_BITS if initial_rows <= TAGGED_ROWS else 0
        self.slot_rows = np.full(_slots_for(initial_rows, MAX_LOAD), -1, dtype=np.int32)  # [S] tag | row, -1 empty

    def __getstate__(self) -> dict:  # copies hold plain row arrays; see __setstate__
        return {k: v for k, v in self.__dict__.items() if k not in ("_keys", "_tabs")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._keys, self._tabs = GrowableArray(self.row_keys), GrowableArray(self.row_tabs)
        self.row_keys, self.row_tabs = self._keys.array, self._tabs.array

    @property
    def row_capacity(self) -> int:
        return self.row_keys.shape[0]

    def nbytes(self) -> int:  # bytes
        return self.row_keys.nbytes + self.row_tabs.nbytes + self.slot_rows.nbytes

    def resident_nbytes(self) -> int:  # bytes in physical memory (row arrays grow without touching their tail)
        return sum(resident_bytes(a) for a in (self.row_keys, self.row_tabs, self.slot_rows))

    def reserve(self, rows: int) -> bool:
        """Make room for ``rows`` rows in total; True when row arrays were reallocated."""
        grown = False
        if rows > self.row_capacity:
            cap = max(rows, int(self.row_capacity * 1.25) + 16)
            self.row_keys = self._keys.grow(cap, self.num_rows)
            self.row_tabs = self._tabs.grow(cap, self.num_rows)
            grown = True
        tag_bits = TAG_BITS if rows <= TAGGED_ROWS else 0
        if rows > MAX_LOAD * self.slot_rows.shape[0] or tag_bits != self.tag_bits:
            self.tag_bits = tag_bits
            self.slot_rows = np.full(_slots_for(rows, REBUILD_LOAD), -1, dtype=np.int32)
            kernels.rebuild_slots(self.row_keys, self.row_tabs, self.num_rows, self.slot_rows, self.tag_bits)
        return grown

    def lookup(self, keys: np.ndarray, tabs: np.ndarray, insert: bool) -> Lookup:
        """Rows of unique (table, key) pairs; ``insert`` adds missing ones as new rows.

        A parallel read-only probe finds the known pairs; only the missing ones
        go through the sequential insert.
        """
        n = keys.shape[0]
        rows = np.empty(n, dtype=np.int64)
        ends = np.empty(n, dtype=np.int64)  # where each probe stopped
        kernels.find(keys, tabs, self.slot_rows, self.row_keys, self.row_tabs, self.tag_bits, rows, ends)
        if not insert:
            return Lookup(rows=rows, new=np.empty(0, dtype=np.int64))
        missing = np.flatnonzero(rows < 0)
        if missing.size == 0:
            return Lookup(rows=rows, new=missing)
        slots = self.slot_rows
        self.reserve(self.num_rows + missing.size)
        # The insert resumes each probe where find stopped, unless reserve rebuilt the slots.
        start = ends[missing] if self.slot_rows is slots else np.empty(0, dtype=np.int64)
        mkeys, mtabs = keys[missing], tabs[missing]
        mrows = np.empty(missing.size, dtype=np.int64)
        new = np.empty(missing.size, dtype=np.int64)
        self.num_rows, n_new = kernels.lookup(
            mkeys, mtabs, start, self.slot_rows, self.row_keys, self.row_tabs, self.tag_bits, mrows, True, self.num_rows, new
        )
        rows[missing] = mrows
        return Lookup(rows=rows, new=missing[new[:n_new]])

    def rows_per_table(self, n_tables: int) -> np.ndarray:  # [n_tables] int64
        return np.bincount(self.row_tabs[: self.num_rows], minlength=n_tables)

    def ids_of(self, table: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, ids) of one table, in row order."""
        rows = np.flatnonzero(self.row_tabs[: self.num_rows] == table)
        return rows, self.row_keys[rows]


class Deduper:
    """Per-batch deduplication of (table, id) pairs; reuses its scratch space across calls."""

    def __init__(self) -> None:
        self._rpos = np.empty((0, 0), dtype=np.int32)  # [P, S] scratch of the split dedupe
        self._pos = np.empty(0, dtype=np.int32)  # [S] scratch of the one-pass dedupe

    def __call__(
        self, keys: np.ndarray, tabs: np.ndarray, ranges: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(unique keys [U], their tables [U], inverse [N] int64) in first-seen order.

        ``ranges`` [P+1]: id boundaries such that no (table, key) pair occurs in two ranges
        (whole features, one table per feature); each range is then deduped on its own
        thread, with the same result.
        """
        n = keys.shape[0]
        if ranges is not None and ranges.shape[0] > 2:
            return self._by_ranges(keys, tabs, ranges)
        size = _next_pow2(2 * n + 1)
        if size != self._pos.shape[0]:
            self._pos = np.empty(size, dtype=np.int32)
        self._pos.fill(-1)
        out_keys = np.empty(n, dtype=np.int64)
        out_tabs = np.empty(n, dtype=np.int32)
        inverse = np.empty(n, dtype=np.int64)
        u = kernels.dedupe(keys, tabs, self._pos, out_keys, out_tabs, inverse)
        return out_keys[:u], out_tabs[:u], inverse

    def _by_ranges(self, keys: np.ndarray, tabs: np.ndarray, ranges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = ranges.shape[0] - 1
        size = _next_pow2(2 * int(np.diff(ranges).max()) + 1)
        if self._rpos.shape != (parts, size):
            self._rpos = np.empty((parts, size), dtype=np.int32)
        self._rpos.fill(-1)
        n = keys.shape[0]
        out_keys = np.empty(n, dtype=np.int64)
        out_tabs = np.empty(n, dtype=np.int32)
        inverse = np.empty(n, dtype=np.int64)
        counts = np.zeros(parts, dtype=np.int64)
        bounds = ranges.astype(np.int64, copy=False)
        kernels.dedupe_ranges(keys, tabs, bounds, self._rpos, out_keys, out_tabs, inverse, counts)
        u = kernels.dedupe_ranges_join(bounds, counts, out_keys, out_tabs, inverse)
        return out_keys[:u], out_tabs[:u], inverse
