"""Horizon: when each row is next needed, from the ids of the next K training batches.

The training pipeline shows a tiered store the ids of upcoming batches long
before their rows are read (``store.horizon`` batches ahead, against the
few batches a read-ahead window holds). The store keeps, per row (lid), the
training lookup that next uses it, and eviction ranks by it: a row used inside
the horizon stays in memory before any row that is not (the sooner its next
use, the later it leaves), and rows not used inside it leave by their access
counts, as without a horizon. On the disk benchmark's trace 128 batches bring
the rows read from disk to 1.10x (int8 cold rows) and 1.22x (fp32) of Belady's
minimum, from 1.55x and 1.71x without (docs/performance.md, "Tables beyond
memory").

Bookkeeping: each foreseen batch keeps its rows (lids) and, per row, the
batch after it inside the horizon that uses the row again (``follow``; linked
when that batch is foreseen). A row's next use is set when it is foreseen
with no earlier use pending, and moves on along its links as the training
lookups consume the batches. 8 bytes per row of the store and 16 per id of
the foreseen batches (the pipeline holds the batches themselves too); the
fast tier keeps a copy of its rows' next uses for eviction (4 bytes a slot).

Deterministic whatever the threads' timing, and across a resume: a lookup
at training step ``s`` ranks by the uses in steps ``s + 1 .. s + K`` only,
whatever was foreseen beyond them (the pipeline foresees step ``s + K``
before it hands out batch ``s``), and ids that had no row when foreseen
keep their entries until a lookup makes their row (``resolve``), so the
ranking depends on the batches and the rows there are, never on when a
batch was foreseen. That is kept only where numbers depend on placement
(``exact``: a lossy cold codec); with fp32 cold rows it would cost more than
it is worth (a pass over those entries per lookup).

>>> import numpy as np
>>> def ids(*x): return np.array(x), np.zeros(len(x), dtype=np.int32)  # (keys, tables) of a batch
>>> h = Horizon(2)
>>> h.foresee(*ids(5, 7), np.array([5, 7]), at=1); h.foresee(*ids(7), np.array([7]), at=2)
>>> h.foresee(*ids(5), np.array([5]), at=3)
>>> h.next_use(np.array([5, 7, 9]), step=0).tolist()  # row 9 is not foreseen
[1, 1, 0]
>>> h.advance(1); h.next_use(np.array([5, 7, 9]), step=1).tolist()  # step 1 consumed: the next uses move on
[3, 2, 0]
>>> h.next_use(np.array([5]), step=0).tolist()  # at step 0 a use at step 3 is past the horizon of 2
[0]
"""

from __future__ import annotations

from collections import deque

import numba as nb
import numpy as np

from tierec.embedding.kernels import key_hash
from tierec.embedding.prefetch import AHEAD, prefetch_row
from tierec.store.hotness import ranked_score


@nb.njit(cache=True, nogil=True, inline="always")
def _link(x, at, pos, step, next_at, last_pos, follow):
    """Row ``x`` is used at step ``at`` (its entry at ``pos``, entered after every earlier use of it): linked
    from its latest pending use, or its next use when none is pending (none after ``step``)."""
    if next_at[x] > step:
        follow[last_pos[x]] = at
    else:
        next_at[x] = at
    last_pos[x] = pos


@nb.njit(cache=True, nogil=True)
def _foresee(e_lid, at, step, next_at, last_pos, follow, base, n):
    """Enter a batch's entries ``base .. base + n`` (their rows in ``e_lid``; -1: no row yet). The rows are
    read and written at random: each is announced ``AHEAD`` entries on, and the earlier entry its link writes
    (``follow`` of its pending use) ``AHEAD / 2`` on, once its row's ``last_pos`` is near: a batch of the disk
    benchmark (40k pairs, 128 batches foreseen) took 1.8 against 2.5 ms, 2.1 against 2.9 with the cache cold."""
    end = base + n
    half = AHEAD // 2
    for p in range(base, end):
        if p + AHEAD < end:
            xa = e_lid[p + AHEAD]
            if xa >= 0:
                prefetch_row(next_at, xa)
                prefetch_row(last_pos, xa)
        if p + half < end:  # its next_at and last_pos are on their way: the entry its link will write
            xh = e_lid[p + half]
            if xh >= 0 and next_at[xh] > step:
                prefetch_row(follow, last_pos[xh])
        follow[p] = 0
        x = e_lid[p]
        if x >= 0:
            _link(x, at, p, step, next_at, last_pos, follow)


@nb.njit(cache=True, nogil=True)
def _advance(e_lid, at, follow, base, n, next_at):
    """Batch ``at`` is being looked up: its rows move on to their next foreseen use (0: none)."""
    end = base + n
    for p in range(base, end):
        if p + AHEAD < end and e_lid[p + AHEAD] >= 0:
            prefetch_row(next_at, e_lid[p + AHEAD])
        x = e_lid[p]
        if x >= 0 and next_at[x] == at:
            next_at[x] = follow[p]


@nb.njit(cache=True, nogil=True)
def _resolve(keys, tabs, lids, u_pos, u_key, u_tab, e_lid, e_at, step, next_at, last_pos, follow, matched):
    """Rows just made (``keys``/``tabs`` -> ``lids``): the entries that named them before they had a row
    (``u_*``, in the order they were foreseen) get them, linked in that order."""
    size = 16
    while size < 2 * keys.shape[0]:
        size *= 2
    table = np.full(size, -1, dtype=np.int64)
    mask = np.uint64(size - 1)
    for i in range(keys.shape[0]):
        j = key_hash(np.int32(tabs[i]), keys[i]) & mask
        while table[j] >= 0:
            j = (j + np.uint64(1)) & mask
        table[j] = i
    for k in range(u_pos.shape[0]):
        p = u_pos[k]
        if e_at[p] <= step:
            continue  # its batch was looked up already
        j = key_hash(np.int32(u_tab[k]), u_key[k]) & mask
        while table[j] >= 0:
            i = table[j]
            if keys[i] == u_key[k] and tabs[i] == u_tab[k]:
                e_lid[p] = lids[i]
                _link(lids[i], e_at[p], p, step, next_at, last_pos, follow)
                matched[k] = True
                break
            j = (j + np.uint64(1)) & mask


@nb.njit(cache=True, nogil=True)
def _ranked(score, slot_lid, next_at, step, until, out):
    """Per slot: ``BEFORE_ALL - next use`` for rows used in steps ``step + 1 .. until``, else ``score``. The
    rows' next uses are read at random: announcing each ``AHEAD`` slots on made it 2.2x faster (1.3M slots
    over 21M rows: 12 ms against 26; it runs at every eviction)."""
    n = next_at.shape[0]
    m = score.shape[0]
    for s in range(m):
        if s + AHEAD < m:
            xa = slot_lid[s + AHEAD]
            if 0 <= xa < n:
                prefetch_row(next_at, xa)
        out[s] = ranked_score(np.float64(score[s]), slot_lid[s], next_at, step, until)


class Horizon:
    """Next uses of a store's rows from the ids of up to ``length`` upcoming training batches (see the module)."""

    def __init__(self, length: int, exact: bool = True) -> None:
        """``exact``: keep the entries of ids without a row until a lookup makes it (what makes the ranking
        independent of when batches were foreseen; it costs a pass over those entries per lookup that makes
        rows: 401 s of wall against 345 s for the first half of the 21M-id run, about 23 ms a step). A store
        whose numbers do not depend on where rows are (fp32 cold rows) leaves them out: their next uses
        count once a batch foreseen after the row was made names it."""
        if length < 0:
            raise ValueError("the horizon's length must be >= 0")
        self.length = length
        self.exact = exact
        self.next_at = np.zeros(0, dtype=np.int32)  # [lids] the training step that next uses each row; 0: none foreseen
        self.last_pos = np.zeros(0, dtype=np.int32)  # [lids] the entry of its latest foreseen use
        # per entry (an id of a foreseen batch): its row (-1: none yet), its step, and the step
        # after it that uses its row again (0: none foreseen)
        self.e_lid = np.zeros(1024, dtype=np.int64)
        self.e_at = np.zeros(1024, dtype=np.int32)
        self.follow = np.zeros(1024, dtype=np.int32)
        self.batches: deque[tuple[int, int, int]] = deque()  # (step, first entry, entries), oldest first
        self._end = 0  # entries in use: those of the batches held, from self.batches[0]'s first
        # the entries of ids that had no row when foreseen (their entry, key, table), in the order foreseen
        self.u_pos = np.zeros(0, dtype=np.int64)
        self.u_key = np.zeros(0, dtype=np.int64)
        self.u_tab = np.zeros(0, dtype=np.int32)
        self.foreseen_to = 0  # the step of the last batch foreseen (0: none since the last clear)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.next_at, self.last_pos, self.e_lid, self.e_at, self.follow, self.u_pos,
                                      self.u_key, self.u_tab))

    def _first(self) -> int:
        return self.batches[0][1] if self.batches else self._end

    def _grow_rows(self, rows: int) -> None:
        if rows > self.next_at.shape[0]:
            n = max(rows, 2 * self.next_at.shape[0])
            for name in ("next_at", "last_pos"):
                old = getattr(self, name)
                new = np.zeros(n, dtype=np.int32)
                new[: old.shape[0]] = old
                setattr(self, name, new)

    def _fit(self, ids: int) -> None:
        """Room for ``ids`` more entries: those of consumed batches go, the rest move to the front. The arrays
        double past what is held when that fills more than 3/5 of them (at least 2/5 left between two moves);
        past a half, as before, the entries held hovered at it and nearly every move made new arrays (3 x 10M
        entries zeroed: 57 of the stage thread's 1,044 samples at 4x fp32, horizon 128)."""
        if self._end + ids <= self.follow.shape[0]:
            return
        base = self._first()
        live = self._end - base
        size = self.follow.shape[0] if 5 * (live + ids) <= 3 * self.follow.shape[0] else 2 * (live + ids)
        for name in ("e_lid", "e_at", "follow"):
            old = getattr(self, name)
            new = old if size == old.shape[0] else np.zeros(size, dtype=old.dtype)
            new[:live] = old[base : self._end]
            setattr(self, name, new)
        self.batches = deque((at, b - base, n) for at, b, n in self.batches)
        self.last_pos -= np.int32(base)  # only pending rows' entries are read
        self.u_pos -= base
        self._end = live

    def foresee(self, keys: np.ndarray, tabs: np.ndarray, lids: np.ndarray, at: int | None = None,
                step: int = 0) -> None:
        """The unique pairs (``keys``, ``tabs``; their rows ``lids``, -1 for none yet) of the batch the training
        lookup number ``at`` will look up (None: the one after the last foreseen, or the next lookup's);
        ``step``: the training lookups done so far. Batches come in the order of their steps."""
        at = max(self.foreseen_to, step) + 1 if at is None else at
        self.foreseen_to = at
        n = lids.shape[0]
        if self.length == 0 or at <= step:
            return
        self._grow_rows(int(lids.max()) + 1 if n else 0)
        self._fit(n)
        base = self._end
        self.e_lid[base : base + n] = lids
        self.e_at[base : base + n] = at
        _foresee(self.e_lid, np.int32(at), np.int32(step), self.next_at, self.last_pos, self.follow, base, n)
        unknown = np.flatnonzero(lids < 0) if self.exact else np.empty(0, dtype=np.int64)
        if unknown.size:
            self.u_pos = np.concatenate([self.u_pos, base + unknown])
            self.u_key = np.concatenate([self.u_key, keys[unknown].astype(np.int64, copy=False)])
            self.u_tab = np.concatenate([self.u_tab, tabs[unknown].astype(np.int32, copy=False)])
        self.batches.append((at, base, n))
        self._end += n

    def resolve(self, keys: np.ndarray, tabs: np.ndarray, lids: np.ndarray, step: int) -> None:
        """Rows just made for pairs ``keys``/``tabs`` (their ``lids``) during training lookup ``step``: the
        foreseen uses they had before they had a row count from now on, so the horizon never depends on
        when a batch was foreseen, only on the batches and the rows there are."""
        if self.u_pos.shape[0] == 0 or lids.shape[0] == 0:
            return
        self._grow_rows(int(lids.max()) + 1)
        matched = np.zeros(self.u_pos.shape[0], dtype=np.bool_)
        _resolve(keys.astype(np.int64, copy=False), tabs.astype(np.int32, copy=False), lids.astype(np.int64, copy=False),
                 self.u_pos, self.u_key, self.u_tab, self.e_lid, self.e_at, np.int32(step), self.next_at,
                 self.last_pos, self.follow, matched)
        if matched.any():
            keep = ~matched
            self.u_pos, self.u_key, self.u_tab = self.u_pos[keep], self.u_key[keep], self.u_tab[keep]

    def advance(self, step: int) -> None:
        """The training lookup number ``step`` starts: batches up to it are consumed."""
        while self.batches and self.batches[0][0] <= step:
            at, base, n = self.batches.popleft()
            _advance(self.e_lid, np.int32(at), self.follow, base, n, self.next_at)
        if not self.batches:
            self._end = 0
        if self.u_pos.shape[0]:
            keep = self.u_pos >= self._first()
            if not keep.all():
                self.u_pos, self.u_key, self.u_tab = self.u_pos[keep], self.u_key[keep], self.u_tab[keep]

    def clear(self) -> None:
        """Forget every foreseen batch (the pipeline stopped)."""
        live = self.e_lid[self._first() : self._end]
        self.next_at[live[live >= 0]] = 0
        self.batches.clear()
        self._end = 0
        self.u_pos, self.u_key, self.u_tab = (np.empty(0, dtype=x.dtype) for x in (self.u_pos, self.u_key, self.u_tab))
        self.foreseen_to = 0

    def forget(self, lids: np.ndarray, keys: np.ndarray, tabs: np.ndarray) -> None:
        """Rows deleted (``lids``, of pairs ``keys``/``tabs``; the lids may be given to other rows): their
        foreseen entries name no row again, until a lookup makes the pair's row anew (``resolve``)."""
        inside = lids < self.next_at.shape[0]
        lids, keys, tabs = lids[inside], keys[inside], tabs[inside]
        if lids.size == 0:
            return
        self.next_at[lids] = 0
        if not self.batches:
            return
        first = self._first()
        live = self.e_lid[first : self._end]
        order = np.argsort(lids)
        where = np.searchsorted(lids[order], np.maximum(live, 0))
        where = np.minimum(where, lids.size - 1)
        hit = np.flatnonzero((live >= 0) & (lids[order][where] == live))
        if hit.size == 0:
            return
        live[hit] = -1  # a view: written through
        if not self.exact:
            return
        src = order[where[hit]]
        pos = np.concatenate([self.u_pos, first + hit])
        key = np.concatenate([self.u_key, keys[src].astype(np.int64, copy=False)])
        tab = np.concatenate([self.u_tab, tabs[src].astype(np.int32, copy=False)])
        by = np.argsort(pos, kind="stable")  # resolve() goes through them in the order foreseen
        self.u_pos, self.u_key, self.u_tab = pos[by], key[by], tab[by]

    @property
    def active(self) -> bool:
        return bool(self.batches)

    def next_use(self, lids: np.ndarray, step: int) -> np.ndarray:
        """The step [n] that next uses each row inside steps ``step + 1 .. step + length``; 0 where none does."""
        out = np.zeros(lids.shape[0], dtype=np.int32)
        known = lids < self.next_at.shape[0]
        t = self.next_at[lids[known]]
        out[known] = np.where((t > step) & (t <= step + self.length), t, 0)
        return out

    def uses(self, step: int) -> tuple[np.ndarray, int, int] | None:
        """(next use per lid, ``step``, the last step inside the horizon): what eviction ranks by at training
        step ``step`` (hotness.ranked_score); None with no batch foreseen."""
        return (self.next_at, step, step + self.length) if self.batches else None

    def ranked(self, score: np.ndarray, lids: np.ndarray, step: int) -> np.ndarray:
        """``score`` [n] (float64) of rows ``lids`` (-1: none) with rows used inside the horizon above all others,
        the sooner the higher: what eviction ranks by (the lowest leave first)."""
        out = np.empty(score.shape[0], dtype=np.float64)
        _ranked(score, lids, self.next_at, np.int32(step), np.int32(step + self.length), out)
        return out
