"""Hotness: the statistics that decide admission, eviction and placement.

- Rows with an entry in the Directory carry a decayed access count and the
  step of their last use (``Directory.freq`` / ``.last``).
- Ids without a row (not admitted yet) are counted in a :class:`CountMinSketch`
  of fixed size: ``depth`` rows of ``width`` counters. Like TinyLFU's "reset",
  every counter is halved once ``10 * width`` sightings were added, so old
  popularity fades and the sketch never saturates.
- :func:`coldest_evictable` chooses which fast-tier slots to free: the lowest
  scores (decayed count for LFU, last use for LRU) among slots that no batch
  in flight has pinned (:func:`evictable` and :func:`lowest` are its plain
  reference, and its path for small tiers).

>>> import numpy as np
>>> from tierec.store.hotness import CountMinSketch
>>> s = CountMinSketch(width=1 << 10, depth=4, seed=0)
>>> k, t = np.array([5, 6], dtype=np.int64), np.zeros(2, dtype=np.int32)
>>> s.add(k, t).tolist(), s.add(k[:1], t[:1]).tolist()
([1, 1], [2])
"""

from __future__ import annotations

import numba as nb
import numpy as np

from tierec.embedding.kernels import key_hash, mix64
from tierec.embedding.prefetch import AHEAD, prefetch_row

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@nb.njit(cache=True, nogil=True)
def _cms_add(keys, tabs, table, seed, out):
    depth, width = table.shape
    mask = np.uint64(width - 1)
    for i in range(keys.shape[0]):
        h = key_hash(np.int32(tabs[i]), keys[i])
        est = np.uint32(0xFFFFFFFF)
        for d in range(depth):
            c = mix64(h ^ (np.uint64(d + 1) * _GOLDEN + np.uint64(seed))) & mask
            v = table[d, c] + np.uint32(1)
            table[d, c] = v
            if v < est:
                est = v
        out[i] = est


class CountMinSketch:
    """Approximate sighting counts of (table, id) pairs; never under-counts (until a halving)."""

    def __init__(self, width: int, depth: int, seed: int) -> None:
        if width & (width - 1) or width <= 0:
            raise ValueError(f"sketch width must be a power of two, got {width}")
        self.table = np.zeros((depth, width), dtype=np.uint32)  # [depth, width]
        self.seed = seed
        self.added = 0  # sightings since the last halving

    def nbytes(self) -> int:
        return self.table.nbytes

    def add(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:
        """Count one sighting of each pair; returns the estimates [n] after counting."""
        out = np.empty(keys.shape[0], dtype=np.int64)
        _cms_add(keys, tabs, self.table, self.seed, out)
        self.added += keys.shape[0]
        if self.added >= 10 * self.table.shape[1]:
            self.table >>= 1
            self.added //= 2
        return out

    def state(self) -> np.ndarray:  # [depth * width + 1] int64, the counter of additions last
        return np.append(self.table.ravel().astype(np.int64), self.added)

    def load(self, flat: np.ndarray) -> None:
        self.table[...] = flat[:-1].reshape(self.table.shape)
        self.added = int(flat[-1])


_SAMPLE = 4096  # lowest(): scores sampled for the bound ...
_SAMPLED_FROM = 1 << 16  # ... from this many scores up
BEFORE_ALL = float(1 << 52)  # scores of rows used inside a horizon (tierec/store/horizon.py): above every count and step


@nb.njit(cache=True, nogil=True, inline="always")
def ranked_score(x, lid, next_at, step, until):
    """A row's eviction score: ``BEFORE_ALL - t`` when its next use ``t = next_at[lid]`` falls in steps
    ``step + 1 .. until`` (the sooner, the higher), else its own score ``x`` (float64; never above the first)."""
    if 0 <= lid < next_at.shape[0]:
        t = next_at[lid]
        if step < t <= until:
            return BEFORE_ALL - t
    return x


@nb.njit(cache=True, nogil=True, inline="always")
def hinted_score(x, s, hint, lid, next_at, step, until):
    """:func:`ranked_score` of the row in fast-tier slot ``s``, its next use read from ``hint[s]`` (the fast
    tier's copy, taken when the row was last looked up) where that is inside the horizon, else from ``next_at``
    at random. A copy inside the horizon is the row's next use still: a later batch's use is linked after it,
    and only the lookup that consumes it moves it on (and takes a new copy); slots whose row left hold 0."""
    t = hint[s]
    if step < t <= until:
        return BEFORE_ALL - t
    return ranked_score(x, lid, next_at, step, until)


def _no_uses() -> tuple[np.ndarray, int, int]:  # next uses that rank no row
    return np.empty(0, dtype=np.int32), 0, 0


@nb.njit(cache=True, nogil=True)
def coin(keys, tabs, seed, step, out):
    """A uniform [0, 1) draw per (table, id, step): reproducible admission by probability."""
    inv = 1.0 / 9007199254740992.0
    for i in range(keys.shape[0]):
        h = mix64(key_hash(np.int32(tabs[i]), keys[i]) ^ mix64(np.uint64(seed) * _GOLDEN + np.uint64(step)))
        out[i] = np.float64(h >> np.uint64(11)) * inv


@nb.njit(cache=True, nogil=True)
def _evictable(slot_lid, pin, keep, clock, pinned_from, score_of_slot, soft, next_at, step, until, out_slots, out_scores):
    n = 0
    for s in range(1, slot_lid.shape[0]):  # slot 0 holds the shared zero row
        if slot_lid[s] < 0 or pin[s] >= pinned_from:
            continue
        if keep[s] >= clock and not soft:
            continue
        out_scores[n] = ranked_score(np.float64(score_of_slot[s]), slot_lid[s], next_at, step, until)
        out_slots[n] = s
        n += 1
    return n


def evictable(slot_lid: np.ndarray, pin: np.ndarray, clock: int, score: np.ndarray, keep: np.ndarray,
              soft: bool = False, in_flight: int = 1, uses: tuple[np.ndarray, int, int] | None = None,
              ) -> tuple[np.ndarray, np.ndarray]:
    """(slots, scores) of occupied slots not pinned by the ``in_flight`` latest lookups (``pin`` [C+1]: the
    lookup that last used each; ``clock``: the lookup now), nor kept for a later batch of the read-ahead
    window (``keep`` [C+1]: the lookup they are kept until) unless ``soft``.

    ``score`` [C+1] is per fast-tier slot (the directory keeps resident rows' counts by slot); ``uses``: the
    rows' next uses ``(next_at [lids], step, until)`` that rank above it (:func:`ranked_score`).
    """
    next_at, step, until = uses if uses is not None else _no_uses()
    slots = np.empty(slot_lid.shape[0], dtype=np.int64)
    scores = np.empty(slot_lid.shape[0], dtype=np.float64)
    n = _evictable(slot_lid, pin, keep, np.int64(clock), np.int64(clock - in_flight + 1), score, soft, next_at,
                   np.int64(step), np.int64(until), slots, scores)
    return slots[:n], scores[:n]


def coldest_evictable(slot_lid: np.ndarray, pin: np.ndarray, clock: int, score: np.ndarray, keep: np.ndarray, k: int,
                      soft: bool = False, in_flight: int = 1, uses: tuple[np.ndarray, int, int] | None = None,
                      hint: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """(slots of the ``k`` lowest scores among the slots :func:`evictable` gives, how many may leave): the
    choice ``lowest`` makes over ``evictable``'s scores (among ties at the k-th score, any of them; here the
    first in slot order), without listing every evictable slot. A bound is taken from the scores of evenly
    spaced slots; one pass keeps the evictable slots below it and the first ``k`` at it, reading a slot's
    pin, and its next use (``uses``, which only raises a score), only where its own score is low enough.
    With a horizon whose batches use most resident rows, most own scores are below the bound (at 4x fp32,
    horizon 128: 154k of 325k slots for 8k rows to leave, their next uses read at random, 3.0 ms a call);
    ``hint`` [C+1] int32, the rows' next uses as the fast tier copied them at their last lookup
    (:func:`hinted_score`), ranks most of those without that read: the same choice, the eviction pass 2.2
    against 4.6 ms a lookup on the same run (py-spy). The count is then a lower bound (``k`` or more) unless
    fewer than ``k`` may leave: where the pass finds too few, the plain path, with the exact count."""
    c = slot_lid.shape[0]
    pinned_from = np.int64(clock - in_flight + 1)
    next_at, step, until = uses if uses is not None else _no_uses()
    hint = np.zeros(c, dtype=np.int32) if hint is None else hint
    step, until = np.int64(step), np.int64(until)
    if c >= _SAMPLED_FROM and k > 0:
        stride = c // _SAMPLE
        sample = np.empty(c // stride + 1, dtype=np.float64)
        m, seen = _sample_evictable(slot_lid, pin, keep, np.int64(clock), pinned_from, score, soft, next_at, step, until,
                                    stride, sample, hint)
        if m > 16:
            j = min(m - 1, int(2 * k * seen / c) + 16)  # twice the share asked for, as in lowest()
            bound = np.partition(sample[:m], j)[j]
            below, below_score = np.empty(c, dtype=np.int32), np.empty(c, dtype=np.float64)  # pages touched on use
            ties = np.empty(k, dtype=np.int32)
            nb_, nt = _lowest_evictable(slot_lid, pin, keep, np.int64(clock), pinned_from, score, soft, next_at, step,
                                        until, bound, k, below, below_score, ties, hint)
            if nb_ >= k:
                return below[np.argpartition(below_score[:nb_], k - 1)[:k]].astype(np.int64), nb_
            if nb_ + nt >= k:  # all below the bound and the first of those at it
                return np.concatenate([below[:nb_], ties[: k - nb_]]).astype(np.int64), k
    slots, scores = evictable(slot_lid, pin, clock, score, keep, soft=soft, in_flight=in_flight, uses=uses)
    return slots[lowest(scores, min(k, slots.size))], int(slots.size)


@nb.njit(cache=True, nogil=True)
def _sample_evictable(slot_lid, pin, keep, clock, pinned_from, score_of_slot, soft, next_at, step, until, stride, out,
                      hint):
    """Scores of the evictable slots among every ``stride``-th; returns (how many, slots looked at)."""
    m = 0
    seen = 0
    for s in range(1, slot_lid.shape[0], stride):
        seen += 1
        if slot_lid[s] < 0 or pin[s] >= pinned_from:
            continue
        if keep[s] >= clock and not soft:
            continue
        out[m] = hinted_score(np.float64(score_of_slot[s]), s, hint, slot_lid[s], next_at, step, until)
        m += 1
    return m, seen


@nb.njit(cache=True, nogil=True)
def _lowest_evictable(slot_lid, pin, keep, clock, pinned_from, score_of_slot, soft, next_at, step, until, bound, k,
                      below, below_score, ties, hint):
    """Evictable slots scoring below ``bound`` (all, in ``below``, their scores in ``below_score``) and at it
    (the first ``k``, in ``ties``), in slot order; returns how many of each. A slot's score as its ``hint``
    gives it (its next use when the copy is inside the horizon, else its own score, a lower bound of the
    ranked one) needs no read at random, so a first pass without branches lists (in ``below``) the evictable
    slots whose hinted score is at or below ``bound``; a second ranks those, the next uses of those without a
    copy inside the horizon read at random, each announced ``AHEAD`` slots on. In one pass the mispredicted
    branches cost as much as those reads: 4.5 against 2.8 ms for 325k slots (4x fp32, horizon 128)."""
    m = 0
    for s in range(1, slot_lid.shape[0]):  # every slot written, the count moved on where it qualifies
        t = hint[s]
        inside = (step < t) & (t <= until)
        x = np.float64(BEFORE_ALL - t) if inside else np.float64(score_of_slot[s])
        ok = (x <= bound) & (slot_lid[s] >= 0) & (pin[s] < pinned_from) & (soft | (keep[s] < clock))
        below[m] = s
        m += np.int64(ok)
    n_below = 0  # the slots kept are written over the list, never ahead of the one read
    n_ties = 0
    n = next_at.shape[0]
    for i in range(m):
        if n and i + AHEAD < m:
            sa = below[i + AHEAD]
            ta = hint[sa]
            xa = slot_lid[sa]
            if not (step < ta <= until) and 0 <= xa < n:
                prefetch_row(next_at, xa)
        s = below[i]
        x = hinted_score(np.float64(score_of_slot[s]), s, hint, slot_lid[s], next_at, step, until)
        if x > bound or (x == bound and n_ties >= k):
            continue
        if x < bound:
            below[n_below] = s
            below_score[n_below] = x
            n_below += 1
        else:
            ties[n_ties] = s
            n_ties += 1
    return n_below, n_ties


@nb.njit(cache=True, nogil=True)
def bucket_quota(hist, k, reverse, take, start):
    """A counting sort's split of the first ``k`` rows in bucket order (``reverse``: the highest bucket first):
    how many each bucket of ``hist`` gives (``take``) and where its first one goes (``start``); returns how
    many in all (at most ``k``)."""
    n = 0
    last = hist.shape[0] - 1
    for j in range(last + 1):
        b = last - j if reverse else j
        m = min(hist[b], k - n)
        take[b], start[b] = m, n
        n += m
        if n == k:
            break
    return n


def lowest(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` lowest scores (any order; among ties at the k-th score, any of them).

    A few lowest of many (an eviction: a few thousand of the fast tier's slots) first keep the scores at or
    below a bound taken from an evenly spaced sample, then select among those: one pass instead of a
    selection over all of them."""
    n = scores.shape[0]
    if k >= n:
        return np.arange(n)
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    if n >= _SAMPLED_FROM and k <= n // 8:
        sample = scores[:: n // _SAMPLE]
        j = min(sample.size - 1, 2 * k * sample.size // n + 16)  # twice the share asked for: rarely short
        cand = np.flatnonzero(scores <= np.partition(sample, j)[j])
        if cand.size >= k:  # every score below the bound is in: so are the k lowest
            return cand[np.argpartition(scores[cand], k - 1)[:k]]
    return np.argpartition(scores, k - 1)[:k]


def highest(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` highest scores, highest first."""
    if k <= 0 or scores.shape[0] == 0:
        return np.empty(0, dtype=np.int64)
    part = np.arange(scores.shape[0]) if k >= scores.shape[0] else np.argpartition(-scores, k - 1)[:k]
    return part[np.argsort(-scores[part], kind="stable")]
