"""Cache simulators on a trace of batches: the offline optimum (Belady's rule) and plain LRU.

A trace is the unique ids of each batch, concatenated (``ids``, dense ints),
with ``ptr`` marking where each batch starts. As in the tiered store, all ids
of a batch must be resident together: an id of the current batch is never a
victim. Every first access is a miss (no prefetch, demand fill).

- ``belady``: on a miss with a full cache, evict the resident id whose next
  use is farthest in the future (never again first). With demand fill this is
  the optimum hit count (Belady's MIN), up to ties inside one batch.
- ``lru``: evict the id used least recently (access order breaks ties within a batch).

>>> import numpy as np
>>> from benchmarks.tiers_sim import belady, lru, next_uses
>>> ptr = np.array([0, 2, 4, 6, 8]); ids = np.array([0, 1, 2, 3, 0, 1, 2, 3])
>>> belady(ptr, ids, next_uses(ptr, ids, 4), capacity=3, n_ids=4), lru(ptr, ids, capacity=3, n_ids=4)
(2, 2)
"""

from __future__ import annotations

import numba as nb
import numpy as np

NEVER = np.int64(1 << 62)


@nb.njit(cache=True)
def next_uses(ptr, ids, n_ids):
    """For every access, the index of the next batch that uses the same id (NEVER if none)."""
    nxt = np.full(n_ids, NEVER, dtype=np.int64)
    out = np.empty(ids.shape[0], dtype=np.int64)
    for b in range(ptr.shape[0] - 2, -1, -1):
        for i in range(ptr[b], ptr[b + 1]):
            out[i] = nxt[ids[i]]
        for i in range(ptr[b], ptr[b + 1]):
            nxt[ids[i]] = b
    return out


@nb.njit(cache=True, inline="always")
def _push(hk, hv, n, k, v):
    """Max-heap push of (key k, id v); returns the new size."""
    i = n
    hk[i] = k
    hv[i] = v
    while i > 0:
        p = (i - 1) >> 1
        if hk[p] >= hk[i]:
            break
        hk[p], hk[i] = hk[i], hk[p]
        hv[p], hv[i] = hv[i], hv[p]
        i = p
    return n + 1


@nb.njit(cache=True, inline="always")
def _pop(hk, hv, n):
    """Removes the max; the caller read hk[0], hv[0] first. Returns the new size."""
    n -= 1
    hk[0] = hk[n]
    hv[0] = hv[n]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= n:
            break
        c = left
        if left + 1 < n and hk[left + 1] > hk[left]:
            c = left + 1
        if hk[i] >= hk[c]:
            break
        hk[c], hk[i] = hk[i], hk[c]
        hv[c], hv[i] = hv[i], hv[c]
        i = c
    return n


@nb.njit(cache=True)
def _simulate(ptr, ids, keys, capacity, n_ids, from_batch=0, prefilled=False):
    """Hits (in batches from ``from_batch`` on) of a demand-fill cache evicting the resident id with the largest key (lazy max-heap).

    ``prefilled``: the cache starts full of the rows first needed (a first access while it has room is a hit)."""
    resident = np.zeros(n_ids, dtype=np.bool_)
    key = np.full(n_ids, -1, dtype=np.int64)
    stamp = np.full(n_ids, -1, dtype=np.int64)
    hk = np.empty(ids.shape[0] + n_ids + 16, dtype=np.int64)
    hv = np.empty(ids.shape[0] + n_ids + 16, dtype=np.int64)
    dk = np.empty(ids.shape[0] + 16, dtype=np.int64)
    dv = np.empty(ids.shape[0] + 16, dtype=np.int64)
    n = 0
    size = 0
    hits = 0
    for b in range(ptr.shape[0] - 1):
        lo, hi = ptr[b], ptr[b + 1]
        for i in range(lo, hi):
            stamp[ids[i]] = b
        for i in range(lo, hi):
            x = ids[i]
            if resident[x]:
                hits += b >= from_batch
                key[x] = keys[i]
                n = _push(hk, hv, n, keys[i], x)
        nd = 0
        for i in range(lo, hi):
            x = ids[i]
            if resident[x]:
                continue
            if prefilled and size < capacity:
                hits += b >= from_batch  # it was there from the start
            while size >= capacity:
                k, v = hk[0], hv[0]
                n = _pop(hk, hv, n)
                if not resident[v] or key[v] != k:
                    continue  # a stale entry
                if stamp[v] == b:  # in this batch: not a victim now
                    dk[nd] = k
                    dv[nd] = v
                    nd += 1
                    continue
                resident[v] = False
                size -= 1
            resident[x] = True
            size += 1
            key[x] = keys[i]
            n = _push(hk, hv, n, keys[i], x)
        for j in range(nd):
            n = _push(hk, hv, n, dk[j], dv[j])
        if n > hk.shape[0] - (hi - lo) - n_ids // 2 - 16:  # compact: keep only live entries
            n = 0
            for x in range(n_ids):
                if resident[x]:
                    n = _push(hk, hv, n, key[x], x)
    return hits


def belady(ptr: np.ndarray, ids: np.ndarray, nxt: np.ndarray, capacity: int, n_ids: int, from_batch: int = 0,
           prefilled: bool = False) -> int:
    """Hits of the offline optimum: evict the farthest next use (counted from batch ``from_batch`` on;
    ``prefilled``: the cache starts holding the first rows needed)."""
    return int(_simulate(ptr.astype(np.int64), ids.astype(np.int64), nxt, capacity, n_ids, from_batch, prefilled))


def lru(ptr: np.ndarray, ids: np.ndarray, capacity: int, n_ids: int) -> int:
    """Hits of least-recently-used eviction (key: minus the position of the last access)."""
    order = -np.arange(ids.shape[0], dtype=np.int64)
    return int(_simulate(ptr.astype(np.int64), ids.astype(np.int64), order, capacity, n_ids))


def windowed(ptr: np.ndarray, ids: np.ndarray, nxt: np.ndarray, capacity: int, n_ids: int, window: int,
             from_batch: int = 0, prefilled: bool = False) -> int:
    """Hits of a cache that knows the ids of the next ``window`` batches: on a miss it evicts first the rows not
    used inside that window, fewest accesses so far first, then the rows used inside it, farthest next use first
    (``window`` 0: access counts only; as long as the trace: Belady's rule); ties go to the lower id. Misses of a
    batch are placed together.

    Two rows fit; at batch 3 row 0 has more accesses than row 1, but row 1 comes back at batch 4:

    >>> ptr = np.arange(7); ids = np.array([0, 0, 1, 2, 1, 1])
    >>> nxt = next_uses(ptr, ids, 3)
    >>> [windowed(ptr, ids, nxt, 2, 3, k) for k in (0, 1, 6)], belady(ptr, ids, nxt, 2, 3)
    ([2, 3, 3], 3)
    """
    nextuse = np.full(n_ids, NEVER, dtype=np.int64)  # before batch b: the next batch that uses each id
    for b in range(ptr.shape[0] - 2, -1, -1):
        nextuse[ids[ptr[b]:ptr[b + 1]]] = b
    count = np.zeros(n_ids, dtype=np.int64)
    resident = np.zeros(n_ids, dtype=bool)
    in_batch = np.zeros(n_ids, dtype=bool)
    size = hits = 0
    for b in range(ptr.shape[0] - 1):
        batch = ids[ptr[b]:ptr[b + 1]]
        miss = batch[~resident[batch]]
        hits += (batch.size - miss.size) * (b >= from_batch)
        if prefilled and size < capacity:  # the first rows needed were there from the start
            taken = miss[: capacity - size]
            resident[taken] = True
            size += taken.size
            hits += taken.size * (b >= from_batch)
            miss = miss[taken.size:]
        room = capacity - size
        if miss.size > room:
            in_batch[batch] = True
            cand = np.flatnonzero(resident & ~in_batch)
            in_batch[batch] = False
            soon = nextuse[cand]
            outside = soon > b + window
            # one key: outside the window by count (low first), inside it by next use (far first); ties by id
            key = np.where(outside, count[cand], count.max() + 1 + (b + window - np.minimum(soon, b + window)))
            key = key * n_ids + cand
            victims = cand[np.argpartition(key, miss.size - room - 1)[: miss.size - room]]
            resident[victims] = False
            size -= victims.size
        resident[miss] = True
        size += miss.size
        count[batch] += 1
        nextuse[batch] = nxt[ptr[b]:ptr[b + 1]]
    return int(hits)
