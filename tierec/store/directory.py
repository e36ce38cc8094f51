"""Directory: where every row of a tiered store lives, keyed by (table, id).

Each known (table, id) pair owns a row id (``lid``). Per lid the directory keeps
the home tier and slot (host DRAM or disk), the fast-tier slot when resident,
and the access statistics (a decayed count and the step of last use). Unlike
the plain HashIndex, rows can be deleted: the open-addressing map uses
backward-shift deletion (no tombstones) and freed lids are reused.

Memory per known id: key 8 + table 2 + home tier 1 + home slot 4 + cache slot 4
+ decayed count 4 + last step 4 bytes (27), plus 4 bytes per hash slot at a load
of at most 0.75 (5.3 to 10.7 bytes per id) and growth slack: about 40 bytes per
id as measured (benchmarks/tiers_memory.py).

All kernels are serial and release the GIL, so the prefetch thread can run
them beside the training step.

>>> import numpy as np
>>> from tierec.store.directory import Directory
>>> d = Directory()
>>> lids = d.insert(np.array([7, 9], dtype=np.int64), np.zeros(2, dtype=np.int32))
>>> d.find(np.array([9, 7, 8], dtype=np.int64), np.zeros(3, dtype=np.int32)).tolist()
[1, 0, -1]
>>> d.delete(np.array([0])); d.num_rows, d.find(np.array([7]), np.zeros(1, dtype=np.int32)).tolist()
(1, [-1])
"""

from __future__ import annotations

import numba as nb
import numpy as np

from tierec.embedding.kernels import key_hash
from tierec.sizes import release_free_memory

MAX_LOAD = 0.75

# Home tier of a row (int8): only in the fast tier (or nowhere yet), host DRAM, disk.
LOC_NONE = 0
LOC_HOST = 1
LOC_DISK = 2


def _next_pow2(n: int) -> int:
    return 1 << max(4, int(n - 1).bit_length())


@nb.njit(cache=True, nogil=True)
def _find(keys, tabs, slots, lid_keys, lid_tabs, out):
    mask = np.uint64(slots.shape[0] - 1)
    for i in range(keys.shape[0]):
        k = keys[i]
        t = tabs[i]
        s = key_hash(np.int32(t), k) & mask
        r = slots[s]
        while r != -1 and not (lid_keys[r] == k and lid_tabs[r] == t):
            s = (s + np.uint64(1)) & mask
            r = slots[s]
        out[i] = r


@nb.njit(cache=True, nogil=True)
def _insert(keys, tabs, lids, slots, lid_keys, lid_tabs):
    """Insert pairs known to be absent and unique, with the given lids."""
    mask = np.uint64(slots.shape[0] - 1)
    for i in range(keys.shape[0]):
        s = key_hash(np.int32(tabs[i]), keys[i]) & mask
        while slots[s] != -1:
            s = (s + np.uint64(1)) & mask
        slots[s] = lids[i]
        lid_keys[lids[i]] = keys[i]
        lid_tabs[lids[i]] = tabs[i]


@nb.njit(cache=True, nogil=True)
def _delete(lids, slots, lid_keys, lid_tabs):
    """Remove lids from the map with backward-shift deletion; marks them free (table -1)."""
    mask = np.uint64(slots.shape[0] - 1)
    for n in range(lids.shape[0]):
        lid = lids[n]
        i = key_hash(np.int32(lid_tabs[lid]), lid_keys[lid]) & mask
        while slots[i] != lid:
            i = (i + np.uint64(1)) & mask
        j = i
        while True:
            j = (j + np.uint64(1)) & mask
            r = slots[j]
            if r == -1:
                break
            home = key_hash(np.int32(lid_tabs[r]), lid_keys[r]) & mask
            # r may move back to the hole at i unless its home lies cyclically in (i, j].
            if i <= j:
                stays = i < home and home <= j
            else:
                stays = home > i or home <= j
            if not stays:
                slots[i] = r
                i = j
        slots[i] = -1
        lid_tabs[lid] = -1


@nb.njit(cache=True, nogil=True)
def _rebuild(lid_keys, lid_tabs, high, slots):
    mask = np.uint64(slots.shape[0] - 1)
    for r in range(high):
        if lid_tabs[r] < 0:
            continue
        s = key_hash(np.int32(lid_tabs[r]), lid_keys[r]) & mask
        while slots[s] != -1:
            s = (s + np.uint64(1)) & mask
        slots[s] = r


@nb.njit(cache=True, nogil=True)
def hash_pairs(keys, tabs, out):
    """A well-mixed 64-bit hash per (table, key) as int64 (deterministic tie-breaks)."""
    for i in range(keys.shape[0]):
        out[i] = np.int64(key_hash(np.int32(tabs[i]), keys[i]) >> np.uint64(1))


class Directory:
    """(table, id) -> lid, and per lid: home tier/slot, fast-tier slot, decayed count, last step."""

    def __init__(self, initial_rows: int = 1024) -> None:
        self.num_rows = 0
        self.high = 0  # lids ever handed out; lids >= high are untouched
        self._free = np.empty(0, dtype=np.int64)  # stack of freed lids
        self._n_free = 0
        self.slots = np.full(_next_pow2(int(initial_rows / MAX_LOAD) + 1), -1, dtype=np.int32)  # [S]
        self.keys = np.zeros(initial_rows, dtype=np.int64)  # [L]
        self.tabs = np.full(initial_rows, -1, dtype=np.int16)  # [L], -1 = free lid
        self.loc = np.zeros(initial_rows, dtype=np.int8)  # [L] LOC_*
        self.home = np.full(initial_rows, -1, dtype=np.int32)  # [L] slot in the home tier (< 2**31)
        self.cslot = np.full(initial_rows, -1, dtype=np.int32)  # [L] fast-tier slot, -1 = not resident
        self.freq = np.zeros(initial_rows, dtype=np.float32)  # [L] decayed access count
        self.last = np.zeros(initial_rows, dtype=np.int32)  # [L] training step of last access

    _COLUMNS = ("keys", "tabs", "loc", "home", "cslot", "freq", "last")
    _FILL = {"keys": 0, "tabs": -1, "loc": 0, "home": -1, "cslot": -1, "freq": 0, "last": 0}

    @property
    def capacity(self) -> int:
        return self.keys.shape[0]

    def nbytes(self) -> int:  # bytes
        return self.slots.nbytes + self._free.nbytes + sum(getattr(self, c).nbytes for c in self._COLUMNS)

    # ------------------------------------------------------------- lookups

    def find(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:
        """lid [N] int64 of each pair, -1 when unknown."""
        out = np.empty(keys.shape[0], dtype=np.int64)
        _find(keys, tabs, self.slots, self.keys, self.tabs, out)
        return out

    def insert(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:
        """New lids [n] for pairs known to be absent and unique; their columns are reset."""
        n = keys.shape[0]
        reuse = min(n, self._n_free)
        lids = np.empty(n, dtype=np.int64)
        lids[:reuse] = self._free[self._n_free - reuse : self._n_free][::-1]
        self._n_free -= reuse
        fresh = n - reuse
        lids[reuse:] = np.arange(self.high, self.high + fresh)
        self._reserve(self.high + fresh, self.num_rows + n)
        self.high += fresh
        for c in self._COLUMNS[2:]:
            getattr(self, c)[lids] = self._FILL[c]
        _insert(keys, tabs.astype(np.int16), lids, self.slots, self.keys, self.tabs)
        self.num_rows += n
        return lids

    def delete(self, lids: np.ndarray) -> None:
        """Forget rows; the caller has freed their slots in every tier."""
        if lids.size == 0:
            return
        _delete(lids.astype(np.int64), self.slots, self.keys, self.tabs)
        self.cslot[lids] = -1
        self.loc[lids] = LOC_NONE
        self.home[lids] = -1
        self.num_rows -= lids.size
        need = self._n_free + lids.size
        if need > self._free.shape[0]:
            self._free = np.resize(self._free, max(need, 2 * self._free.shape[0] + 16))
        self._free[self._n_free : need] = lids
        self._n_free = need

    def _reserve(self, lids: int, rows: int) -> None:
        grew_columns = lids > self.capacity
        if grew_columns:
            cap = max(lids, int(self.capacity * 1.25) + 16)
            for c in self._COLUMNS:
                old = getattr(self, c)
                new = np.full(cap, self._FILL[c], dtype=old.dtype)
                new[: old.shape[0]] = old
                setattr(self, c, new)
        grown = grew_columns
        if rows > MAX_LOAD * self.slots.shape[0]:
            self.slots = np.full(_next_pow2(int(rows / MAX_LOAD) + 1), -1, dtype=np.int32)
            _rebuild(self.keys, self.tabs, self.high, self.slots)
            grown = True
        if grown:
            release_free_memory()

    # ----------------------------------------------------------- listings

    def live(self) -> np.ndarray:
        """lids of all known rows, ascending."""
        return np.flatnonzero(self.tabs[: self.high] >= 0)

    def of_table(self, table: int) -> np.ndarray:
        """lids of one table's rows, ordered by id (a canonical order for checkpoints)."""
        lids = np.flatnonzero(self.tabs[: self.high] == table)
        return lids[np.argsort(self.keys[lids], kind="stable")]

    def rows_per_table(self, n_tables: int) -> np.ndarray:  # [n_tables] int64
        t = self.tabs[: self.high]
        return np.bincount(t[t >= 0], minlength=n_tables)

    def hashes(self, lids: np.ndarray) -> np.ndarray:
        out = np.empty(lids.shape[0], dtype=np.int64)
        hash_pairs(self.keys[lids], self.tabs[lids].astype(np.int32), out)
        return out
