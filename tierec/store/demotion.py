"""ColdHostRows: which host rows go to disk when rows leaving the fast tier need host slots.

The host rows leave in the order the fast tier's eviction ranks its own rows
(tierec/store/eviction.py): first the rows no foreseen batch uses, fewest
accesses first, then, with a horizon (tierec/store/horizon.py), the rows the
foreseen batches use, farthest next use first. A row leaving the fast tier
takes the slot of a host row only where it ranks above it, so host and fast
tier together keep about what one pool of their size would. The rule before
kept every host row a foreseen batch used: rows leaving the fast tier went to
disk while host rows used a hundred batches later stayed (4x, fp32 rows,
horizon 128: 1.22x the disk reads of Belady's rule, now 0.99x; the same tiers
with the whole budget as fast tier read 1.01x). That order applies where the
host holds at least ``RANKED_FROM`` times the rows a demotion asks for;
below, host rows leave by counts and those the horizon uses stay. The rows a
lookup brings up from the host leave it before its evictions
(TierStore._lift_from_host), so rows sent down take their slots rather than
disk, and no demotion moves a row that lookup needs.

A row's place in that order has few values: its quantised access count
(256 of them: counts do not change while a row is on the host) or, inside
the horizon, the step of its next use. The host rows are kept in a bucket
queue, one FIFO list per value (the steps on a ring of ``horizon + 2``): a row
joins its bucket when it comes to the host (:meth:`came`, or all of them in
lid order when the queue is made), and a demotion walks the buckets in order
from the first, taking the rows still on the host. A row's place only rises
while it stays on the host (a foreseen use comes into the horizon, then
nearer), so the walk checks each row it meets: one that left the host is
dropped, one whose place rose moves to its new bucket, later in the walk. The
buckets of steps gone by are emptied the same way as the horizon moves on. The
queue is made anew when the hotness pass moves the counts on (:meth:`forget`),
when the horizon starts or stops, and when entries of rows that left the host
fill it (``GARBAGE`` times the rows it was made with): 8 bytes an entry. It
gives the lowest-ranked host rows exactly (tests/store/test_demotion.py, against
a sort of every host row). The list it replaced (sorted by rank, the rows that
came inserted in place, ranked ``max_rows // 8`` at a time, newcomers left for
the next ranking without a horizon) was an approximation of that order: at 4x
with fp32 rows and a horizon of 128 the queue reads 6,071 disk rows a step
against 6,843 (4,751 either way on the single-thread lookup trace,
``--which oracle``), and its calls take about a third fewer of the lookup
thread's samples. Which host rows go to
disk moves encoded records only: it changes no number, whatever the cold codec.

>>> import numpy as np
>>> from tierec.store.directory import Directory, LOC_HOST
>>> d = Directory()
>>> lids = d.insert(np.arange(4), np.zeros(4, dtype=np.int32))
>>> d.loc[lids] = LOC_HOST; d.freq[lids] = [5.0, 1.0, 3.0, 9.0]
>>> rows = ColdHostRows(d, Horizon(0), 64)
>>> rows.candidates(2, 0)[0].tolist()  # fewest accesses first
[1, 2]
"""

from __future__ import annotations

import numba as nb
import numpy as np

from tierec.store.directory import LOC_HOST, Directory, quantise
from tierec.store.horizon import Horizon


# The horizon's order where the host holds at least this many times the rows one demotion asks for; below, by
# counts: at 16x fp32, horizon 128, the horizon's order everywhere read 15,151 disk rows a step against 14,861 and
# was no faster (the bucket queue, 2026-12-07; with the list before, it read 2-4% fewer and cost 4-9 ms a step).
RANKED_FROM = 24
COUNTS = 256  # buckets of the quantised access counts; the horizon's steps follow
GARBAGE = 2  # the queue is made anew once it holds this many times the rows it was made with (rows gone meanwhile)


@nb.njit(cache=True, nogil=True, inline="always")
def _place(x, q, next_at, step, until, ring):
    """The bucket of row ``x`` with quantised count ``q``. At a walk a ring bucket holds one step of the
    horizon (the ring is longer than it), so the bucket says where a row belongs."""
    t = next_at[x] if x < next_at.shape[0] else 0
    if step < t <= until:
        return COUNTS + t % ring
    return q


@nb.njit(cache=True, nogil=True, inline="always")
def _append(b, e, heads, tails, e_next):
    e_next[e] = -1
    if tails[b] < 0:
        heads[b] = e
    else:
        e_next[tails[b]] = e
    tails[b] = e


@nb.njit(cache=True, nogil=True, inline="always")
def _push(x, q, next_at, step, until, ring, heads, tails, e_lid, e_next, free):
    """Row ``x`` (quantised count ``q``) joins its bucket, in an entry from the free list (``free[0]`` its head,
    ``free[1]`` its length; free entries are linked through ``e_next`` too)."""
    e = free[0]
    free[0], free[1] = e_next[e], free[1] - 1
    e_lid[e] = x
    _append(_place(x, q, next_at, step, until, ring), e, heads, tails, e_next)


@nb.njit(cache=True, nogil=True)
def _file(lids, qs, next_at, step, until, ring, heads, tails, e_lid, e_next, free):
    """Rows ``lids`` (quantised counts ``qs``) join their buckets."""
    for i in range(lids.shape[0]):
        _push(lids[i], qs[i], next_at, step, until, ring, heads, tails, e_lid, e_next, free)


@nb.njit(cache=True, nogil=True)
def _file_homed(tier, fq, high, loc, next_at, step, until, ring, heads, tails, e_lid, e_next, free):
    """Every row homed in ``loc`` (away from the fast tier) joins its bucket, in lid order."""
    for x in range(high):
        if tier[x] == loc:
            _push(x, fq[x], next_at, step, until, ring, heads, tails, e_lid, e_next, free)


@nb.njit(cache=True, nogil=True, inline="always")
def _first_time(x, seen, mask):
    """True the first time row ``x`` comes to this open-addressing set (``seen``: -1 where empty); it is in after."""
    j = (x * 2654435761) & mask
    while seen[j] >= 0:
        if seen[j] == x:
            return False
        j = (j + 1) & mask
    seen[j] = x
    return True


@nb.njit(cache=True, nogil=True)
def _walk(buckets, want, tier, fq, loc, next_at, step, until, ring, heads, tails, e_lid, e_next, free, out):
    """Walk ``buckets`` in order, taking up to ``want`` rows still homed in ``loc`` (into ``out``): entries of rows
    gone go back to the free list, rows whose place rose move to their bucket. ``want`` < 0: take none, move
    every row whose place changed (the buckets of steps gone by). Returns the rows taken."""
    size = 16
    while size < 2 * want:
        size *= 2
    seen = np.full(size, -1, dtype=np.int64)  # the rows taken (a second entry of one is dropped)
    n = 0
    for b in buckets:
        prev = -1
        e = heads[b]
        while e >= 0 and n != want:
            nxt = e_next[e]
            x = e_lid[e]
            to = -1  # gone, or a second entry of a row taken already
            if tier[x] == loc:
                to = _place(x, fq[x], next_at, step, until, ring)
                if to == b:  # in place
                    if want < 0:
                        prev, e = e, nxt
                        continue
                    if _first_time(np.int64(x), seen, size - 1):
                        out[n] = x
                        n += 1
                        prev, e = e, nxt
                        continue
                    to = -1
            if prev < 0:  # unlink e
                heads[b] = nxt
            else:
                e_next[prev] = nxt
            if tails[b] == e:
                tails[b] = prev
            if to < 0:
                e_next[e] = free[0]
                free[0], free[1] = e, free[1] + 1
            else:  # to its bucket, later in the walk
                _append(to, e, heads, tails, e_next)
            e = nxt
    return n


class _Queue:
    """The buckets' FIFO lists over a pool of entries, a row each (4 bytes) and the next entry (4 bytes); the
    free entries make a list of their own."""

    def __init__(self, n_buckets: int, entries: int) -> None:
        self.heads = np.full(n_buckets, -1, dtype=np.int32)
        self.tails = np.full(n_buckets, -1, dtype=np.int32)
        self.e_lid = np.empty(entries, dtype=np.int32)
        self.e_next = np.arange(1, entries + 1, dtype=np.int32)
        self.e_next[-1] = -1
        self.free = np.array([0, entries], dtype=np.int64)  # the free list's head and length

    @property
    def used(self) -> int:
        return self.e_lid.shape[0] - int(self.free[1])

    def room(self, n: int) -> None:
        """At least ``n`` free entries (the pool grows by half, or as needed)."""
        if self.free[1] >= n:
            return
        old = self.e_lid.shape[0]
        size = max(old + old // 2, old + n - int(self.free[1]))
        e_lid, e_next = np.empty(size, dtype=np.int32), np.empty(size, dtype=np.int32)
        e_lid[:old], e_next[:old] = self.e_lid, self.e_next
        e_next[old:] = np.arange(old + 1, size + 1, dtype=np.int32)
        e_next[-1] = self.free[0]  # the new entries first, then the free ones there were
        self.e_lid, self.e_next = e_lid, e_next
        self.free[:] = old, self.free[1] + size - old

    def nbytes(self) -> int:
        return self.heads.nbytes + self.tails.nbytes + self.e_lid.nbytes + self.e_next.nbytes


class ColdHostRows:
    def __init__(self, index: Directory, horizon: Horizon, host_rows: int | None) -> None:
        """``horizon``: the store's (next uses of its rows); ``host_rows``: the host tier's bound (None: none)."""
        self.index = index
        self.horizon = horizon
        self.host_rows = host_rows
        self.ring = horizon.length + 2  # the horizon's steps, on a ring of buckets
        self._by_horizon = False  # this queue's order: the horizon's (else counts, the rows it uses kept)
        self._queue: _Queue | None = None  # None: make it anew
        self._made = 1  # rows the queue was made with
        self._active = False  # the horizon had batches when the queue was made
        self._cleaned = 0  # the last step whose bucket was emptied

    def forget(self) -> None:
        """Make the queue anew at the next call (the counts moved on)."""
        self._queue = None

    def nbytes(self) -> int:
        return self._queue.nbytes() if self._queue is not None else 0

    def _uses(self, step: int) -> tuple[np.ndarray, int]:
        uses = self.horizon.uses(step)
        return (uses[0], uses[2]) if uses is not None else (np.zeros(0, dtype=np.int32), step)

    def came(self, lids: np.ndarray, step: int) -> None:
        """Rows ``lids`` are being homed on the host at training step ``step`` (still in the fast tier: placed by
        the count they will have there); candidates from now on."""
        q = self._queue
        if q is None or lids.size == 0:
            return
        if q.used + lids.size > GARBAGE * max(self._made, lids.size):  # mostly rows gone: make it anew next time
            self._queue = None
            return
        q.room(lids.size)
        next_at, until = self._uses(step)
        qs = quantise(self.index.freq[lids]).astype(np.int64)
        _file(lids.astype(np.int64, copy=False), qs, next_at, np.int64(step), np.int64(until), np.int64(self.ring),
              q.heads, q.tails, q.e_lid, q.e_next, q.free)

    def candidates(self, need: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(lids [m], ranks [m]) of up to ``need`` rows homed on the host that rank lowest now (Horizon.ranked
        at training step ``step``), lowest first."""
        if self._queue is None or self._active != self.horizon.active:
            self._make(need, step)
        q = self._queue
        next_at, until = self._uses(step)
        d = self.index
        args = (d.tier, d.fq, np.int8(LOC_HOST), next_at, np.int64(step), np.int64(until), np.int64(self.ring),
                q.heads, q.tails, q.e_lid, q.e_next, q.free)
        if self._active and step > self._cleaned:  # the buckets of the steps gone by: their rows to their place
            gone = np.arange(max(self._cleaned + 1, step - self.ring + 1), step + 1)
            _walk(COUNTS + gone % self.ring, -1, *args, np.empty(0, dtype=np.int64))
            self._cleaned = step
        buckets = np.arange(COUNTS)
        if self._by_horizon and self._active:  # then the rows the horizon uses, farthest next use first
            buckets = np.concatenate([buckets, COUNTS + np.arange(until, step, -1) % self.ring])
        out = np.empty(need, dtype=np.int64)
        n = _walk(buckets, need, *args, out)
        lids = out[:n]
        return lids, self._rank(lids, step)

    def _make(self, need: int, step: int) -> None:
        d = self.index
        self._active = self.horizon.active
        self._by_horizon = self._active and (self.host_rows is None or self.host_rows >= RANKED_FROM * need)
        homed = int(np.count_nonzero(d.tier[: d.high] == LOC_HOST))
        q = _Queue(COUNTS + self.ring, max(homed + homed // 4, 1024))
        next_at, until = self._uses(step)
        _file_homed(d.tier, d.fq, np.int64(d.high), np.int8(LOC_HOST), next_at, np.int64(step), np.int64(until),
                    np.int64(self.ring), q.heads, q.tails, q.e_lid, q.e_next, q.free)
        self._queue, self._made, self._cleaned = q, max(homed, 1), step

    def _rank(self, lids: np.ndarray, step: int) -> np.ndarray:
        """Horizon.ranked of host rows ``lids`` (by counts: those the horizon uses rank inf)."""
        r = self.index.freq[lids].astype(np.float64)
        if not self.horizon.active:
            return r
        if self._by_horizon:
            return self.horizon.ranked(r, lids, step)
        r[self.horizon.next_use(lids, step) > 0] = np.inf
        return r
