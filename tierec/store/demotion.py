"""ColdHostRows: which host rows go to disk when rows leaving the fast tier need host slots.

The host rows leave in the order the fast tier's eviction ranks its own rows
(tierec/store/eviction.py): first the rows no foreseen batch uses, fewest
accesses first, then, with a horizon (tierec/store/horizon.py), the rows the
foreseen batches use, farthest next use first; ties by lid. A row leaving the
fast tier takes the slot of a host row only where it ranks above it, so host
and fast tier together keep about what one pool of their size would. The rule
before kept every host row a foreseen batch used: rows leaving the fast tier
went to disk while host rows used a hundred batches later stayed (4x, fp32 rows,
horizon 128: 1.22x the disk reads of Belady's rule, now 0.99x; the same tiers
with the whole budget as fast tier read 1.01x). That order applies where the
host holds at least ``RANKED_FROM`` times the rows a demotion asks for; on a
smaller host it read 2-4% fewer rows for 4-9 ms more CPU a lookup, so there host
rows leave by counts and those the horizon uses stay. The rows a lookup brings up from
the host leave it before its evictions (TierStore._lift_from_host), so rows
sent down take their slots rather than disk, and no demotion moves a row that
lookup needs.

The ranking is a pass over every lid (a counting sort over the 256 quantised
counts, then the horizon's steps), made for ``max_rows // 8`` rows at once.
With a horizon, rows that come to the host later join the list by their rank
then (:meth:`came`); a row's rank only rises while it stays on the host (a
foreseen use comes into the horizon, then nearer), so each call ranks again
only the head of the list, moving the rows whose rank rose to their place.
Without one, rows that came since wait for the next ranking, as before (taking
them at once read 3% more rows from disk: a row just sent down has few
accesses, and is often used again soon). The list is ranked anew when too few
of it are left on the host, when it has grown to four times its size, or when
the hotness pass moves the counts on (:meth:`forget`). Which host rows go to
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

from tierec.store.directory import LOC_HOST, Directory, dequantise, quantise
from tierec.store.hotness import bucket_quota
from tierec.store.horizon import Horizon


# The horizon's order where the host holds at least this many times the rows one demotion asks for; below, by
# counts (2026-12-07: at 16x the horizon's order read 2-4% fewer rows and cost the lookup thread 4-9 ms a step).
RANKED_FROM = 24


class ColdHostRows:
    def __init__(self, index: Directory, horizon: Horizon, host_rows: int | None) -> None:
        """``horizon``: the store's (next uses of its rows); ``host_rows``: the host tier's bound (None: none)."""
        self.index = index
        self.horizon = horizon
        self.host_rows = host_rows
        self.batch = max((host_rows or 0) // 8, 1)  # rows ranked per pass at least
        self._by_horizon = False  # this ranking's order: the horizon's (else counts, the rows it uses kept)
        # host rows by their rank when ranked or when they came (lowest first), and those ranks; None: rank anew
        self._lids: np.ndarray | None = None
        self._ranks = np.empty(0, dtype=np.float64)
        self._cut = np.inf  # the rank of the last row the ranking took, where it left rows out
        self._size = 1  # rows the ranking took

    def forget(self) -> None:
        """Rank again at the next call (the counts moved on)."""
        self._lids = None

    def came(self, lids: np.ndarray, step: int) -> None:
        """Rows ``lids`` were just homed on the host (at training step ``step``): with a horizon, candidates from
        now on, in the order of their rank now (without one, from the next ranking)."""
        if self._lids is None or lids.size == 0 or not self._by_horizon:
            return
        r = self._rank(lids, step, coming=True)
        order = np.argsort(r, kind="stable")
        at = np.searchsorted(self._ranks, r[order], side="right")
        self._lids = np.insert(self._lids, at, lids[order])
        self._ranks = np.insert(self._ranks, at, r[order])

    def candidates(self, need: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(lids [m], ranks [m]) of up to ``need`` rows homed on the host that rank lowest now (Horizon.ranked
        at training step ``step``), lowest first, from the ``2 * need`` first of the list still on the host
        (the rest ranked above them when listed, and ranks only rise)."""
        if self._lids is not None and self._lids.size > 4 * self._size:  # mostly rows that left: rank anew
            self._lids = None
        fresh = self._lids is None
        if fresh:
            self._rank_anew(need, step)
        for _ in range(3):
            head = self._valid_head(2 * need)
            if head < need and not fresh:  # too few left: rank anew
                self._rank_anew(need, step)
                fresh = True
                head = self._valid_head(2 * need)
            r = self._rank(self._lids[:head], step)
            risen = r > self._ranks[:head]
            if not risen.any():
                break
            self._move(risen, r)  # rows whose rank rose since they were listed go to their place
        else:  # more of the list rose than three heads: rank anew
            self._rank_anew(need, step)
            fresh = True
            head = self._valid_head(2 * need)
            r = self._ranks[:head]
        lids, ranks = _lowest_once(self._lids[:head], r, need)
        if not self._by_horizon and ranks.size and np.isinf(ranks[-1]):  # by counts the rows the horizon uses stay
            lids, ranks = lids[np.isfinite(ranks)], ranks[np.isfinite(ranks)]
        if not fresh and ranks.size and ranks[-1] > self._cut:
            self._lids = None  # rows left out of the ranking may rank below these now: rank anew
            return self.candidates(need, step)
        return lids, ranks

    def _rank_anew(self, need: int, step: int) -> None:
        k = max(self.batch, 4 * need)  # a small host is ranked whole: nothing left out
        self._by_horizon = self.horizon.active and (self.host_rows is None or self.host_rows >= RANKED_FROM * need)
        self._lids = coldest_homed(self.index, k, LOC_HOST, self.horizon.uses(step) if self._by_horizon else None)
        # ascending in the horizon's order; by counts the rows the horizon uses rank inf among them, and a rank
        # only rises to inf there, which _move puts last
        self._ranks = self._rank(self._lids, step)
        self._cut = float(self._ranks[-1]) if self._lids.size == k else np.inf  # rows left out rank at or above it
        self._size = max(self._lids.size, need)

    def _valid_head(self, n: int) -> int:
        """Drop the rows that left the host from the front of the list until its first ``n`` (or all) are on
        the host; returns how many of them there are."""
        good = 0
        while good < min(n, self._lids.size):
            end = min(self._lids.size, good + 2 * (n - good))
            here = self.index.away_in(self._lids[good:end], LOC_HOST)
            if not here.all():
                keep = np.concatenate([np.arange(good), good + np.flatnonzero(here), np.arange(end, self._lids.size)])
                self._lids, self._ranks = self._lids[keep], self._ranks[keep]
            good += int(np.count_nonzero(here))
        return min(n, self._lids.size)

    def _move(self, risen: np.ndarray, r: np.ndarray) -> None:
        """The head's rows ``risen`` (mask over the first ``risen.size``), now ranked ``r[risen]``, to their place."""
        n = risen.size
        moved = self._lids[:n][risen]
        stay = np.concatenate([np.flatnonzero(~risen), np.arange(n, self._lids.size)])
        self._lids, self._ranks = self._lids[stay], self._ranks[stay]
        order = np.argsort(r[risen], kind="stable")
        moved, moved_r = moved[order], r[risen][order]
        at = np.searchsorted(self._ranks, moved_r, side="right")
        self._lids, self._ranks = np.insert(self._lids, at, moved), np.insert(self._ranks, at, moved_r)

    def _rank(self, lids: np.ndarray, step: int, coming: bool = False) -> np.ndarray:
        """Horizon.ranked of rows ``lids``; ``coming``: rows still in the fast tier, ranked by the count they will
        have on the host (quantised)."""
        r = self.index.freq[lids]
        if coming:
            r = dequantise(quantise(r))
        r = r.astype(np.float64)
        if not self.horizon.active:
            return r
        if self._by_horizon:
            return self.horizon.ranked(r, lids, step)
        r[self.horizon.next_use(lids, step) > 0] = np.inf  # by counts: the rows the horizon uses stay
        return r


def _lowest_once(lids: np.ndarray, ranks: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` lowest ranks' lids, lowest first, each lid once (a row listed twice: it left the host and came
    back)."""
    while True:
        m = min(k, lids.size)
        if m == 0 or bool(np.all(ranks[1:] >= ranks[:-1])):  # the list's head, no rank risen: in order already
            pick = np.arange(m)
        else:
            pick = np.argpartition(ranks, m - 1)[:m] if m < lids.size else np.arange(m)
            pick = pick[np.argsort(ranks[pick], kind="stable")]
        _, first = np.unique(lids[pick], return_index=True)
        if first.size == pick.size or m == lids.size:
            first.sort()
            return lids[pick[first]], ranks[pick[first]]
        keep = np.ones(lids.size, dtype=bool)  # not the later entries of the rows picked twice: pick again
        keep[pick] = False
        keep[pick[first]] = True
        lids, ranks = lids[keep], ranks[keep]


def coldest_homed(d: Directory, k: int, loc: int, uses: tuple[np.ndarray, int, int] | None) -> np.ndarray:
    """lids of the ``k`` rows homed in ``loc`` (away from the fast tier) that leave first (the module's order)."""
    next_at, step, until = uses if uses is not None else (np.empty(0, dtype=np.int32), 0, 0)
    out = np.empty(max(min(k, d.high), 0), dtype=np.int64)
    n = _coldest_homed(d.tier, d.fq, d.high, np.int8(loc), next_at, np.int64(step), np.int64(until), out.size, out)
    return out[:n]


@nb.njit(cache=True, nogil=True, inline="always")
def _key(q, t, step, until):
    """A row's place in the order: its quantised count ``q`` (0-255) unless a foreseen batch uses it (its next
    use ``t``; 0: none), then 256 plus how much sooner than the horizon's last step. Scalars in: with the arrays
    passed in and read here a histogram pass took 3x as long."""
    if step < t <= until:
        return 256 + (until - t)
    return np.int64(q)


@nb.njit(cache=True, nogil=True)
def _coldest_homed(tier, fq, high, loc, next_at, step, until, k, out):
    """A histogram pass over the keys, then a collecting pass (a counting sort); returns how many were
    written to ``out``, in order, ties by lid. Whether a row is homed in ``loc`` is a select, not a branch (a
    third of the rows are, at random): over 2.6M lids, 789k on the host (4x, int8 rows) 8 against 42 ms."""
    n_keys = 256 + max(until - step, 0)
    n_next = min(next_at.shape[0], high)  # rows past it have no foreseen use
    hist = np.zeros(n_keys + 1, dtype=np.int64)  # the last: rows homed elsewhere (a select, not a branch)
    for r in range(high):
        b = _key(fq[r], next_at[r] if r < n_next else 0, step, until)
        hist[b if tier[r] == loc else n_keys] += 1
    take, start = np.zeros(n_keys + 1, dtype=np.int64), np.zeros(n_keys + 1, dtype=np.int64)
    n = bucket_quota(hist[:n_keys], k, False, take[:n_keys], start[:n_keys])
    if n == 0:
        return 0
    for r in range(high):  # rows homed elsewhere in the last bucket, which gives none: one branch, rarely taken
        b = _key(fq[r], next_at[r] if r < n_next else 0, step, until)
        b = b if tier[r] == loc else n_keys
        if take[b] > 0:
            out[start[b]] = r
            start[b] += 1
            take[b] -= 1
    return n
