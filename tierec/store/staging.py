"""Staging: disk records of upcoming batches, read ahead while the step computes.

The training pipeline names the rows a window of upcoming batches will need
(:meth:`TieredGroup.stage`); the group asks its disk tier to read those of
them that live only on disk, as one deduplicated set on the read-ahead
threads, and files the pending read here under a token. When a lookup later
brings a row up from disk, it first takes the row's record from a staged
window, and reads only the rest on demand.

A staged record is used only while it is still the row's record: the row's
home is the same disk slot, and that slot's segment was not reused since
(:meth:`DiskTier.epochs`); a row that came up and went down again meanwhile
has a new home and is read afresh. Staging never moves, pins, inserts or
counts a row, so every number of a run is the same with it or without it,
whatever the timing of the reads (tests/store/test_staging.py).

A window also keeps what its dedupe and probe found (:class:`WindowIds`): the
window's unique pairs, the lid each had, and per batch where its ids fall among
them. A batch's lookup then starts from there (:meth:`Staging.resolve`): its
own unique pairs in first-seen order, which is what the per-batch dedupe gives,
from the window's positions (no hashing), and their lids, so only pairs unknown
when the window was probed are probed again. A lid is trusted only while no row
was deleted since (the directory's ``deletions``), so the rows found are those of
a probe (tests/store/test_window_ids.py).

>>> import numpy as np
>>> s = Staging()
>>> s.held_rows, s.nbytes()
(0, 0)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numba as nb
import numpy as np

from tierec.store.disk import PendingRead
from tierec.store.sorted_search import find_sorted, lower_bounds

ROW_BOOKKEEPING = 21  # bytes per row read ahead besides its record: row, slot and epoch int32, keep-until int64, a flag


@dataclass
class BatchIds:
    """One batch of a window: its ids as its lookup will ask for them, and their pairs' positions."""

    keys: np.ndarray  # [n] int64 ids, in the order the collection's forward reads them
    tabs: np.ndarray  # [n] int32 their tables (within the group)
    inverse: np.ndarray  # [n] int32 position of each among the window's unique pairs
    taken: bool = False  # resolved for its lookup
    looked_up: bool = False  # and that lookup is done


@dataclass
class WindowIds:
    """What a window's dedupe and probe found: its unique pairs, their lids then, and its batches."""

    keys: np.ndarray  # [U] int64 unique ids of the window
    tabs: np.ndarray  # [U] int32 their tables
    lids: np.ndarray  # [U] int64 each pair's lid when probed (-1: unknown then)
    deletions: int  # the directory's deletions when probed: the lids hold while it is unchanged
    batches: list[BatchIds] = field(default_factory=list)


@dataclass(frozen=True)
class Resolved:
    """A batch's unique pairs (first-seen order, as the dedupe gives them) and what the window knew of them."""

    keys: np.ndarray  # [u] int64
    tabs: np.ndarray  # [u] int32
    inverse: np.ndarray  # [n] int64 id occurrence -> unique position
    lids: np.ndarray  # [u] int64 lid when the window was probed, -1 unknown then
    deletions: int  # valid while the directory's deletions equal this
    batch: BatchIds | None = None  # the window's batch it came from (its lookup marks it looked up)


@dataclass(frozen=True)
class Found:
    """The lids a probe found for some pairs (-1: no row then), valid while the directory's deletions equal
    ``deletions`` (a pair's lid changes only when its row is deleted)."""

    lids: np.ndarray  # [n] int64
    deletions: int


@dataclass(frozen=True)
class SeenBatch:
    """One batch as the horizon saw it (``TierStore.foresee``): its unique pairs in first-seen order, its ids'
    positions among them and the lids found then (None: none found for us)."""

    keys: np.ndarray  # [u] int64
    tabs: np.ndarray  # [u] int32
    inverse: np.ndarray  # [n] int32
    found: Found | None


def compose_window(
    seen: list[SeenBatch], dedupe: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], Found | None]:
    """A window's unique pairs (first-seen order), each batch's positions among them ([n] int32 each) and their
    lids, from its batches' own dedupes: the pairs and positions of deduping the window's ids at once (a
    batch's unique pairs come in its first-seen order) for a dedupe of fewer ids, and the lids the batches'
    ``foresee`` found (-1 where the one kept found none: probed again), valid while no row was deleted since
    the earliest of them."""
    k, tb, inverse = dedupe(np.concatenate([s.keys for s in seen]), np.concatenate([s.tabs for s in seen]))
    inverse = inverse.astype(np.int32)
    ends = np.cumsum([0] + [s.keys.shape[0] for s in seen])
    pos = [inverse[lo:hi][s.inverse] for s, lo, hi in zip(seen, ends[:-1], ends[1:])]
    if any(s.found is None for s in seen):
        return k, tb, pos, None
    lids = np.full(k.shape[0], -1, dtype=np.int64)
    lids[inverse] = np.concatenate([s.found.lids for s in seen])
    return k, tb, pos, Found(lids, min(s.found.deletions for s in seen))


@dataclass
class _Window:
    lids: np.ndarray  # [n] int32 sorted row ids
    slots: np.ndarray  # [n] int32 their disk slots when staged
    epochs: np.ndarray  # [n] int32 the slots' segment epochs when staged
    read: PendingRead  # records in the order of ``lids``
    until: np.ndarray  # [n] int64 the lookup the window last needs each row at (-1: not kept)
    used: np.ndarray  # [n] bool: taken by a lookup
    ids: WindowIds | None = None  # the window's unique pairs and batches (what resolve() starts from)


@dataclass
class StagingStats:
    staged_rows: int = 0  # rows read ahead
    used_rows: int = 0  # of which a lookup took
    dropped_rows: int = 0  # rows not read ahead: the window held all that store.memory_budget leaves it
    read_s: float = 0.0  # wall time of the reads ahead
    wait_s: float = 0.0  # of which lookups waited for (not hidden)
    resolved_batches: int = 0  # batches whose lookup started from their window's dedupe and probe


class Staging:
    def __init__(self) -> None:
        self._windows: dict[int, _Window] = {}
        self._next = 0
        self.stats = StagingStats()

    @property
    def held_rows(self) -> int:
        return sum(w.lids.size for w in list(self._windows.values()))

    def nbytes(self) -> int:
        """Bytes held: per row its record (with the lid header) and its bookkeeping (``ROW_BOOKKEEPING``). Safe
        beside a lookup on another thread (a report's): it sums a copy of the windows, taken at once."""
        return sum(w.read.nbytes + w.lids.nbytes + w.slots.nbytes + w.epochs.nbytes + w.until.nbytes + w.used.nbytes
                   for w in list(self._windows.values()))

    def room(self, budget: int, record_bytes: int, wanted: int) -> int:
        """How many of ``wanted`` more rows of ``record_bytes`` fit beside the windows held in ``budget`` bytes
        (each row also holds a row id, slot, epoch, keep-until and a flag: ``ROW_BOOKKEEPING``); the rest are dropped."""
        fits = max((budget - self.nbytes()) // (record_bytes + ROW_BOOKKEEPING), 0)
        self.stats.dropped_rows += max(wanted - fits, 0)
        return min(wanted, fits)

    def not_staged(self, lids: np.ndarray) -> np.ndarray:
        """[n] bool: rows no window holds yet."""
        out = np.ones(lids.size, dtype=bool)
        for w in self._windows.values():
            out &= ~find_sorted(w.lids, lids)[0]
        return out

    def current(self, lids: np.ndarray, slots: np.ndarray, epochs: np.ndarray) -> np.ndarray:
        """[n] bool: rows ``lids`` (int64) homed at ``slots`` with ``epochs`` now of which a window holds the
        current record (what :meth:`take` would find; a row staged before its record moved is not)."""
        found = np.zeros(lids.shape[0], dtype=bool)
        pos = np.empty(lids.shape[0], dtype=np.int64)
        for w in self._windows.values():
            if w.lids.size and _locate(w.lids, w.slots, w.epochs, lids, slots, epochs, found, pos):
                found |= pos >= 0
        return found

    def add(
        self, lids: np.ndarray, slots: np.ndarray, epochs: np.ndarray, read: PendingRead, until: np.ndarray,
        ids: WindowIds | None = None,
    ) -> int:
        """File a pending read of rows ``lids`` (sorted) at ``slots`` (none: a window of ``ids`` only);
        returns the window's token. Rows, slots and epochs are kept as int32 (the directory's widths: a
        fast-tier slot's row and a row's home are int32 there), keep-until as int64."""
        token = self._next
        self._next += 1
        i32 = (np.asarray(x).astype(np.int32, copy=False) for x in (lids, slots, epochs))
        self._windows[token] = _Window(*i32, read, np.asarray(until, dtype=np.int64), np.zeros(lids.size, dtype=bool), ids)
        self.stats.staged_rows += int(lids.size)
        return token

    def take(
        self, lids: np.ndarray, slots: np.ndarray, epochs: np.ndarray, out: np.ndarray, keep: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(found [n] bool, the lid header of each found record [n] int32, -1 elsewhere) of rows ``lids``
        (int64) whose home is ``slots`` (int64) with ``epochs`` now, from the windows whose copy is still
        current (the newest window first). Fills ``out[found]`` [n, W] with their payloads and ``keep[found]``
        with the lookup their window needs them until; the other rows of both are left as they are."""
        n = lids.shape[0]
        found = np.zeros(n, dtype=bool)
        header = np.full(n, -1, dtype=np.int32)
        pos = np.empty(n, dtype=np.int64)
        for w in reversed(list(self._windows.values())):
            if w.lids.size == 0:  # a window of ids only
                continue
            if _locate(w.lids, w.slots, w.epochs, lids, slots, epochs, found, pos) == 0:
                continue  # nothing here: its reads are not waited for
            rec = w.read.result()  # [m, 1 + W]: the lid header, then the payload
            _copy_found(rec, rec.view(np.int32), w.until, w.used, pos, found, out, keep, header)
        return found, header

    def rehome(self, lids: np.ndarray, slots: np.ndarray, epochs: np.ndarray, since: float) -> None:
        """Records of rows ``lids`` moved within the disk tier to ``slots`` (with ``epochs``), byte for byte
        (compaction, begun at ``time.perf_counter()`` = ``since``): the windows whose reads had all ended by
        then keep their copies of them current. At 4x fp32 with a horizon about 160 of a lookup's 6,070 disk
        rows were read again for want of that, the lookup waiting for them."""
        if lids.size == 0 or not self._windows:
            return
        order = np.argsort(lids)
        lids, slots, epochs = lids[order].astype(np.int64, copy=False), slots[order], epochs[order]
        for w in self._windows.values():
            if w.lids.size == 0 or not w.read.read_before(since):
                continue
            found, pos = find_sorted(lids, w.lids.astype(np.int64))
            if found.any():
                w.slots[found] = slots[pos[found]]
                w.epochs[found] = epochs[pos[found]]

    def resolve(self, keys: np.ndarray, tabs: np.ndarray) -> Resolved | None:
        """The unique pairs of a batch's ids ``keys``/``tabs`` (exactly as a window staged them) and their lids
        then, from the oldest window that holds that batch; None when none does."""
        for w in self._windows.values():
            if w.ids is None:
                continue
            for b in w.ids.batches:
                if b.taken or b.keys.shape != keys.shape or not same_ids(b.keys, b.tabs, keys, tabs):
                    continue
                b.taken = True
                self.stats.resolved_batches += 1
                mark = np.full(w.ids.keys.shape[0], -1, dtype=np.int32)
                pos = np.empty(keys.shape[0], dtype=np.int64)
                inverse = np.empty(keys.shape[0], dtype=np.int64)
                u = _first_seen(b.inverse, mark, pos, inverse)
                pos = pos[:u]
                return Resolved(w.ids.keys[pos], w.ids.tabs[pos], inverse, w.ids.lids[pos], w.ids.deletions, b)
        return None

    def looked_up(self, token: int) -> bool:
        """Every batch of window ``token`` was looked up from it (False for a window without batches, or gone)."""
        w = self._windows.get(token)
        return w is not None and w.ids is not None and all(b.looked_up for b in w.ids.batches)

    def release(self, token: int) -> None:
        """Drop a window (its batches were looked up, or will not come)."""
        w = self._windows.pop(token, None)
        if w is None:
            return
        w.read.cancel()
        self.stats.read_s += w.read.read_s
        self.stats.wait_s += w.read.wait_s
        self.stats.used_rows += int(w.used.sum())

    def clear(self) -> None:
        for token in list(self._windows):
            self.release(token)


@nb.njit(cache=True, nogil=True)
def _first_seen(positions, mark, first, inverse):
    """Dedupe of a batch whose ids are ``positions`` among a window's unique pairs: ``first[:u]`` the positions
    in first-seen order, ``inverse`` [n] each id's index among them; returns u. ``mark`` [U] is all -1."""
    u = 0
    for i in range(positions.shape[0]):
        p = positions[i]
        m = mark[p]
        if m < 0:
            m = u
            mark[p] = u
            first[u] = p
            u += 1
        inverse[i] = m
    return u


@nb.njit(cache=True, nogil=True)
def same_ids(a_keys, a_tabs, b_keys, b_tabs):
    """Whether two batches' ids (same length) are the same, stopping at the first difference (the batches
    compared before the one that matches differ early; ``np.array_equal`` compares every id)."""
    for i in range(a_keys.shape[0]):
        if a_keys[i] != b_keys[i] or a_tabs[i] != b_tabs[i]:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def _locate(w_lids, w_slots, w_epochs, lids, slots, epochs, found, pos):
    """``pos[i]``: where row ``lids[i]`` (not ``found`` yet) is in a window (sorted ``w_lids``) whose copy of
    it is still current (same slot and epoch), else -1; returns how many are."""
    m = w_lids.shape[0]
    todo = np.empty(lids.shape[0], dtype=np.int64)  # the rows not found yet: only they are searched
    u = 0
    for i in range(lids.shape[0]):
        pos[i] = -1
        if not found[i]:
            todo[u] = i
            u += 1
    q = np.empty(u, dtype=np.int64)
    for j in range(u):
        q[j] = lids[todo[j]]
    at = np.empty(u, dtype=np.int64)
    lower_bounds(w_lids, q, at)  # batched: 5.7x one search per row
    hits = 0
    for j in range(u):
        i, lo = todo[j], at[j]
        if lo < m and w_lids[lo] == q[j] and w_slots[lo] == slots[i] and w_epochs[lo] == epochs[i]:
            pos[i] = lo
            hits += 1
    return hits


@nb.njit(cache=True, nogil=True)
def _copy_found(rec, rec_words, until, used, pos, found, out, keep, header):
    """The records ``_locate`` found: payload to ``out``, keep-until to ``keep``, lid header to ``header``."""
    width = out.shape[1]
    for i in range(pos.shape[0]):
        p = pos[i]
        if p < 0:
            continue
        found[i] = True
        for j in range(width):
            out[i, j] = rec[p, 1 + j]
        keep[i] = until[p]
        header[i] = rec_words[p, 0]
        used[p] = True
