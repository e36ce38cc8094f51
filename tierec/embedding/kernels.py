"""Numba kernels for the CPU hot path: id hashing, dedupe + index lookup, row init.

These are the loops torch cannot vectorise (an open-addressing hash map). They
work on numpy views of torch CPU tensors, so no copy is made. Every kernel has
a plain reference in the tests.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from tierec.embedding.prefetch import AHEAD, prefetch_at, prefetch_row

EMPTY = np.int32(-1)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@nb.njit(inline="always", cache=True)
def mix64(x: np.uint64) -> np.uint64:
    """splitmix64's finaliser: a bijective, well-mixed 64-bit hash."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@nb.njit(inline="always", cache=True)
def key_hash(table: np.int32, key: np.int64) -> np.uint64:
    return mix64(np.uint64(key) ^ (np.uint64(table + 1) * _GOLDEN))


@nb.njit(inline="always", cache=True)
def home_slot(h: np.uint64, n_slots: np.uint64) -> np.uint64:
    """Slot of hash ``h`` in a table of ``n_slots`` < 2**32 slots, of any size: the top 32 bits
    of ``h`` scaled to ``[0, n_slots)`` by a multiply and a shift (no modulo, no power-of-two size)."""
    return ((h >> np.uint64(32)) * n_slots) >> np.uint64(32)


@nb.njit(inline="always", cache=True)
def slot_tag(h: np.uint64, tag_bits: np.int64) -> np.int32:
    """The tag stored above the row number in a slot: ``tag_bits`` low bits of the hash
    (``home_slot`` uses the top bits), shifted to bits 31 - tag_bits .. 30."""
    return np.int32((h & np.uint64((1 << tag_bits) - 1)) << np.uint64(31 - tag_bits))


@nb.njit(cache=True)
def dedupe(keys, tabs, scratch_pos, out_keys, out_tabs, inverse):
    """Unique (table, key) pairs in first-seen order, and each input's position among them.

    keys [N] int64, tabs [N] int32; scratch_pos has a power-of-two size >= 2N and must
    be filled with -1. Returns the number of unique pairs U; out_keys[:U], out_tabs[:U]
    hold them and inverse [N] maps input -> unique. A scratch slot holds only the pair's
    number; its key and table are read back from out_keys / out_tabs, which are smaller
    than a scratch table of keys and so more often in cache.
    """
    mask = np.uint64(scratch_pos.shape[0] - 1)
    u = 0
    n = keys.shape[0]
    for i in range(n):
        if i + AHEAD < n:  # the scratch slot of the key AHEAD on: its miss overlaps this one's work
            prefetch_row(scratch_pos, key_hash(tabs[i + AHEAD], keys[i + AHEAD]) & mask)
        k = keys[i]
        t = tabs[i]
        s = key_hash(t, k) & mask
        while True:
            p = scratch_pos[s]
            if p == -1:
                scratch_pos[s] = u
                out_keys[u] = k
                out_tabs[u] = t
                inverse[i] = u
                u += 1
                break
            if out_keys[p] == k and out_tabs[p] == t:
                inverse[i] = p
                break
            s = (s + np.uint64(1)) & mask
    return u


@nb.njit(parallel=True, cache=True)
def dedupe_ranges(keys, tabs, bounds, scratch_pos, out_keys, out_tabs, inverse, counts):
    """``dedupe`` of each id range bounds[p] .. bounds[p+1]-1 on its own thread.

    Valid when no (table, key) pair occurs in two ranges (ranges of whole features, one
    table per feature). Range p uses row p of scratch_pos [P, S] (S a power of two > 2x the
    longest range, filled with -1) and writes its unique pairs to
    out_keys/out_tabs from position bounds[p] on, counts[p] of them, and inverse as
    numbers within the range; ``dedupe_ranges_join`` makes one numbering of them.
    """
    mask = np.uint64(scratch_pos.shape[1] - 1)
    for p in nb.prange(bounds.shape[0] - 1):
        lo = bounds[p]
        hi = bounds[p + 1]
        u = 0
        for i in range(lo, hi):
            if i + AHEAD < hi:
                prefetch_at(scratch_pos, p, key_hash(tabs[i + AHEAD], keys[i + AHEAD]) & mask)
            k = keys[i]
            t = tabs[i]
            s = key_hash(t, k) & mask
            while True:
                q = scratch_pos[p, s]
                if q == -1:
                    scratch_pos[p, s] = u
                    out_keys[lo + u] = k
                    out_tabs[lo + u] = t
                    inverse[i] = u
                    u += 1
                    break
                if out_keys[lo + q] == k and out_tabs[lo + q] == t:
                    inverse[i] = q
                    break
                s = (s + np.uint64(1)) & mask
        counts[p] = u


@nb.njit(parallel=True, cache=True)
def dedupe_ranges_join(bounds, counts, out_keys, out_tabs, inverse):
    """Number the ranges' unique pairs one after another, in range order (the order a single
    ``dedupe`` of all ids gives when no pair spans two ranges); returns the number of pairs."""
    n_parts = bounds.shape[0] - 1
    base = np.zeros(n_parts + 1, dtype=np.int64)
    for p in range(n_parts):
        base[p + 1] = base[p] + counts[p]
    for p in nb.prange(n_parts):
        for i in range(bounds[p], bounds[p + 1]):
            inverse[i] += base[p]
    for p in range(1, n_parts):  # compact: move range p's pairs down to base[p] (never overlaps forward)
        for u in range(counts[p]):
            out_keys[base[p] + u] = out_keys[bounds[p] + u]
            out_tabs[base[p] + u] = out_tabs[bounds[p] + u]
    return base[n_parts]


@nb.njit(cache=True)
def lookup(keys, tabs, start, slot_rows, row_keys, row_tabs, tag_bits, rows_out, insert, n_rows, new_out):
    """Find the row of each unique (table, key); with ``insert`` add missing ones.

    slot_rows [S] int32 is an open-addressing map onto rows (any size S < 2**32,
    linear probing from ``home_slot``, -1 when empty); a slot holds only a row number, and the row's own key
    (row_keys [R] int64) and table (row_tabs [R], int8 or int16) confirm a match, which
    keeps the index at a few bytes per row. Missing pairs get row -1 without
    ``insert``, else rows n_rows, n_rows+1, ... and their positions in ``keys``
    are listed in new_out. Returns (n_rows, n_new).

    ``start`` [N] (or empty) is where to begin each probe instead of the home slot:
    the empty slot at which ``find`` gave up on that key, when the slot array has not
    changed since. Slots are only ever filled, so every slot between the home slot
    and that one still holds another key, and the walk over them (one ``row_keys``
    read each, a likely cache miss) is not repeated.

    A slot holds ``tag | row``: with ``tag_bits`` > 0 the bits above the row number
    hold that many bits of the key's hash, and a slot whose tag differs is skipped
    without reading ``row_keys`` (15 of 16 foreign keys at 4 bits).
    """
    n_slots = np.uint64(slot_rows.shape[0])
    row_mask = np.int32((1 << (31 - tag_bits)) - 1)
    n_new = 0
    resume = start.shape[0] > 0
    n = keys.shape[0]
    for i in range(n):
        if i + AHEAD < n:  # the first slot the key AHEAD on will read: its miss overlaps this work
            ia = i + AHEAD
            if resume:
                prefetch_row(slot_rows, start[ia])
            else:
                prefetch_row(slot_rows, home_slot(key_hash(tabs[ia], keys[ia]), n_slots))
        k = keys[i]
        t = tabs[i]
        h = key_hash(t, k)
        tag = slot_tag(h, tag_bits)
        s = np.uint64(start[i]) if resume else home_slot(h, n_slots)
        while True:
            v = slot_rows[s]
            if v == -1:
                if insert:
                    slot_rows[s] = tag | np.int32(n_rows)
                    row_keys[n_rows] = k
                    row_tabs[n_rows] = t
                    rows_out[i] = n_rows
                    new_out[n_new] = i
                    n_new += 1
                    n_rows += 1
                else:
                    rows_out[i] = -1
                break
            if v & ~row_mask == tag:
                r = v & row_mask
                if row_keys[r] == k and row_tabs[r] == t:
                    rows_out[i] = r
                    break
            s += np.uint64(1)
            if s == n_slots:
                s = np.uint64(0)
    return n_rows, n_new


@nb.njit(cache=True)
def rebuild_slots(row_keys, row_tabs, n_rows, slot_rows, tag_bits):
    """Re-insert rows 0..n_rows-1 into an all-empty slot array (after growth)."""
    n_slots = np.uint64(slot_rows.shape[0])
    # The home slot of the row AHEAD on is prefetched (its hash kept in a ring of AHEAD
    # entries, so each row is hashed once): the random slot reads overlap. 2M rows: 36 -> 19 ms.
    ring = np.empty(AHEAD, dtype=np.uint64)
    mask = AHEAD - 1  # AHEAD is a power of two
    for r in range(min(AHEAD, n_rows)):
        ring[r] = key_hash(np.int32(row_tabs[r]), row_keys[r])
        prefetch_row(slot_rows, home_slot(ring[r], n_slots))
    for r in range(n_rows):
        h = ring[r & mask]
        ra = r + AHEAD
        if ra < n_rows:
            ha = key_hash(np.int32(row_tabs[ra]), row_keys[ra])
            ring[ra & mask] = ha
            prefetch_row(slot_rows, home_slot(ha, n_slots))
        s = home_slot(h, n_slots)
        while slot_rows[s] != -1:
            s += np.uint64(1)
            if s == n_slots:
                s = np.uint64(0)
        slot_rows[s] = slot_tag(h, tag_bits) | np.int32(r)


@nb.njit(parallel=True, cache=True)
def init_rows(weights, rows, keys, tabs, scales, seed):
    """Deterministic uniform(-scale, scale) init of each new row from (seed, table, key, column).

    The value depends only on the id, never on insertion order or process, so
    a sharded or resumed run initialises the same rows identically.
    weights [R, D] float32; rows/keys/tabs [n]; scales [n_tables] float32.
    """
    d = weights.shape[1]
    inv = 1.0 / 9007199254740992.0  # 2**-53
    for i in nb.prange(rows.shape[0]):
        h = key_hash(tabs[i], keys[i]) ^ mix64(np.uint64(seed) + _GOLDEN)
        s = scales[tabs[i]]
        for j in range(d):
            x = mix64(h + np.uint64(j + 1) * _GOLDEN)
            u = np.float64(x >> np.uint64(11)) * inv  # [0, 1)
            weights[rows[i], j] = np.float32((2.0 * u - 1.0) * s)


@nb.njit(parallel=True, cache=True)
def find(keys, tabs, slot_rows, row_keys, row_tabs, tag_bits, rows_out, end_out):
    """Read-only, parallel lookup: the row of each (table, key), or -1 when absent.

    end_out [N] int64 receives the slot where each probe stopped (for an absent key,
    the empty slot an insert would take first; ``lookup`` resumes from it).
    """
    n_slots = np.uint64(slot_rows.shape[0])
    row_mask = np.int32((1 << (31 - tag_bits)) - 1)
    n = keys.shape[0]
    half = AHEAD // 2
    for i in nb.prange(n):
        # Two-stage prefetch: the home slot of the key AHEAD on, and the id and table of the
        # row in the (by now cached) home slot of the key AHEAD/2 on.
        if i + AHEAD < n:
            prefetch_row(slot_rows, home_slot(key_hash(tabs[i + AHEAD], keys[i + AHEAD]), n_slots))
        if i + half < n:
            va = slot_rows[home_slot(key_hash(tabs[i + half], keys[i + half]), n_slots)]
            if va != -1:
                prefetch_row(row_keys, va & row_mask)
                prefetch_row(row_tabs, va & row_mask)
        k = keys[i]
        t = tabs[i]
        h = key_hash(t, k)
        tag = slot_tag(h, tag_bits)
        s = home_slot(h, n_slots)
        r = -1
        while True:
            v = slot_rows[s]
            if v == -1:
                break
            if v & ~row_mask == tag:
                c = v & row_mask
                if row_keys[c] == k and row_tabs[c] == t:
                    r = c
                    break
            s += np.uint64(1)
            if s == n_slots:
                s = np.uint64(0)
        rows_out[i] = r
        end_out[i] = s
