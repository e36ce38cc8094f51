"""Which chunk positions a pruning step keeps: the most important ones that fit in the budget.

Every chunk position of every row has a score (``+inf``: must keep, ``-inf``:
may not be kept) and a cost in bytes: its group's chunk bytes, plus the row's
per-row state for a row's first position. The positions are put in one order,
score descending, then the row's tie key (a hash of its id, so the order does
not depend on row numbering or on how rows are spread over processes), then
group, then position; the longest prefix of that order whose bytes fit is
kept, and the must-keep positions always are. Scores never increase along a
row, so every row keeps a prefix of its chunks.

:func:`select` is the plain version over one process's arrays (it sorts).
:func:`select_spread` keeps the same positions when the rows are spread over
the processes of a job, without moving them: a radix descent over the 128-bit
sort key (32-bit score, 64-bit tie key, 16-bit group, 16-bit position), one
all-reduce of a 256-bin histogram of bytes per 8-bit digit (16 rounds of 2 KiB,
whatever the number of rows); the processes agree on the first position that
does not fit and each keeps its own positions before it.

>>> import numpy as np
>>> s = np.array([[3, 2, 2, 1], [2, 2, 1, 1]], dtype=np.float32)   # [rows, positions]
>>> keys = np.array([7, 5], dtype=np.uint64)
>>> select([s], [10], 30, [keys])[0][0].tolist()                      # 3, then the 2s of row 1 (key 5) first
[1, 2]
>>> halves = [Positions([s[:1]], [10], [keys[:1]]), Positions([s[1:]], [10], [keys[1:]])]
>>> [c[0].tolist() for c in select_spread(halves, 30, OneProcess())[0]]
[[1], [2]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

_ROUNDS = 16  # 8-bit digits of the 128-bit key
_FIELD = ((0, 24), (0, 16), (0, 8), (0, 0), *((1, 56 - 8 * i) for i in range(8)), (2, 24), (2, 16), (2, 8), (2, 0))


class JobReduce(Protocol):
    """How the processes of a job combine what the pruner needs (one process: nothing to combine)."""

    rank: int

    def sum(self, values: np.ndarray) -> np.ndarray:  # elementwise sum over the job's processes
        ...

    def min(self, value: float) -> float:  # the smallest ``value`` over the job's processes
        ...


class OneProcess:
    rank = 0

    def sum(self, values: np.ndarray) -> np.ndarray:
        return values

    def min(self, value: float) -> float:
        return value


def descending_key(scores: np.ndarray) -> np.ndarray:
    """float32 scores -> uint32 keys whose ascending order is the scores' descending order (-0.0 == 0.0)."""
    bits = (np.asarray(scores, dtype=np.float32) + np.float32(0.0)).view(np.uint32)
    ascending = np.where(bits >> 31, ~bits, bits | np.uint32(1 << 31))
    return ~ascending


class Positions:
    """One process's (or one part's) chunk positions as sort keys and costs; must-keep ones apart."""

    def __init__(self, scores: Sequence[np.ndarray], chunk_bytes: Sequence[int], tie_keys: Sequence[np.ndarray],
                 row_bytes: Sequence[int] | None = None) -> None:
        row_bytes = row_bytes or [0] * len(scores)
        self.rows = [s.shape[0] for s in scores]
        self.must = [(s == np.inf).sum(axis=1) for s in scores]  # [n_rows] per group
        self.must_bytes = 0
        hi, mid, lo, cost, group, row, score = [], [], [], [], [], [], []
        for g, (s, b, t, rb) in enumerate(zip(scores, chunk_bytes, tie_keys, row_bytes)):
            c = np.full(s.shape, b, dtype=np.int64)
            c[:, 0] += rb
            self.must_bytes += int(c[s == np.inf].sum())
            r, p = np.nonzero((s > -np.inf) & (s < np.inf))
            score.append(s[r, p])
            hi.append(descending_key(score[-1]))
            mid.append(np.asarray(t, dtype=np.uint64)[r])
            lo.append((np.uint32(g) << np.uint32(16)) | p.astype(np.uint32))
            cost.append(c[r, p])
            group.append(np.full(r.size, g, dtype=np.int32))
            row.append(r)
        self.key = (np.concatenate(hi), np.concatenate(mid), np.concatenate(lo))  # [n] uint32, uint64, uint32
        self.cost = np.concatenate(cost)  # [n] bytes
        self.group, self.row = np.concatenate(group), np.concatenate(row)
        self.score = np.concatenate(score)  # [n] float32

    def digit(self, i: int, sel: np.ndarray) -> np.ndarray:  # digit ``i`` (0 = most significant) of positions ``sel``
        field, shift = _FIELD[i]
        return ((self.key[field][sel] >> shift) & 0xFF).astype(np.int64)

    def before(self, bound: tuple[int, int, int]) -> np.ndarray:  # [n] bool: ordered before ``bound``
        (a, b, c), (x, y, z) = self.key, bound
        return (a < x) | ((a == x) & ((b < y) | ((b == y) & (c < z))))

    def counts(self, kept: np.ndarray) -> list[np.ndarray]:  # chunks kept per row, per group
        out = []
        for g, (n, must) in enumerate(zip(self.rows, self.must)):
            sel = self.group == g
            out.append(must + np.bincount(self.row[sel][kept[sel]], minlength=n).astype(must.dtype))
        return out


def select_spread(parts: Sequence[Positions], budget: int, job: JobReduce) -> tuple[list[list[np.ndarray]], float]:
    """Chunks to keep per row, per group, of each of this process's ``parts``, and the threshold.

    Collective: every process of ``job`` calls it with its own parts. The threshold is the
    lowest score kept (``-inf`` when everything fits, ``inf`` when only must-keep positions do).
    """
    budget -= int(job.sum(np.array([sum(p.must_bytes for p in parts)], dtype=np.int64))[0])
    total = int(job.sum(np.array([sum(int(p.cost.sum()) for p in parts)], dtype=np.int64))[0])
    if total <= budget:
        return [p.counts(np.ones(p.cost.size, dtype=bool)) for p in parts], -np.inf
    bound = [0, 0, 0]
    spent = 0  # bytes of the positions ordered before the prefix fixed so far
    active = [np.arange(p.cost.size) for p in parts]
    if budget >= 0:
        for i in range(_ROUNDS):  # spent <= budget < spent + bytes under the prefix
            digits = [p.digit(i, a) for p, a in zip(parts, active)]
            hist = sum((np.bincount(d, weights=p.cost[a], minlength=256) for p, d, a in zip(parts, digits, active)),
                       np.zeros(256))
            cum = np.cumsum(job.sum(np.rint(hist).astype(np.int64)))
            d = int(np.flatnonzero(spent + cum > budget)[0])
            spent += int(cum[d - 1]) if d else 0
            field, shift = _FIELD[i]
            bound[field] |= d << shift
            active = [a[dig == d] for a, dig in zip(active, digits)]
    kept = [p.before(tuple(bound)) if budget >= 0 else np.zeros(p.cost.size, dtype=bool) for p in parts]
    low = min((float(p.score[k].min()) for p, k in zip(parts, kept) if k.any()), default=np.inf)
    tau = float(job.min(low))
    return [p.counts(k) for p, k in zip(parts, kept)], tau


def select(
    scores: list[np.ndarray],
    chunk_bytes: list[int],
    budget: int,
    tie_keys: list[np.ndarray] | None = None,
    row_bytes: list[int] | None = None,
) -> tuple[list[np.ndarray], float]:
    """The plain version: chunks to keep per row ``[n_rows]`` for each group, and the threshold.

    ``scores[g]`` is ``[n_rows, K]``, non-increasing along each row; ``tie_keys[g]`` is
    ``[n_rows]`` (default: row order). One sort over (score desc, tie key, group, position),
    then the longest prefix whose bytes fit.
    """
    tie_keys = tie_keys or [np.arange(s.shape[0], dtype=np.uint64) for s in scores]
    row_bytes = row_bytes or [0] * len(scores)
    flat = np.concatenate([s.ravel() for s in scores]).astype(np.float32) + np.float32(0.0)
    cost = []
    for s, b, rb in zip(scores, chunk_bytes, row_bytes):
        c = np.full(s.shape, b, dtype=np.int64)
        c[:, 0] += rb
        cost.append(c.ravel())
    sizes = np.concatenate(cost)
    keys = np.concatenate([np.repeat(np.asarray(t, dtype=np.uint64), s.shape[1]) for s, t in zip(scores, tie_keys)])
    group = np.concatenate([np.full(s.size, g) for g, s in enumerate(scores)])
    pos = np.concatenate([np.tile(np.arange(s.shape[1]), s.shape[0]) for s in scores])
    order = np.lexsort((pos, group, keys, -flat))
    v = flat[order]
    must, finite = v == np.inf, (v > -np.inf) & (v < np.inf)
    keep_sorted = must | (finite & (np.cumsum(sizes[order]) <= budget))  # must-keep first: the order's head
    keep = np.zeros(flat.size, dtype=bool)
    keep[order[keep_sorted]] = True
    out, start = [], 0
    for s in scores:
        out.append(keep[start : start + s.size].reshape(s.shape).sum(axis=1))
        start += s.size
    if int(sizes[order][must | finite].sum()) <= budget:
        return out, -np.inf
    kept = v[keep_sorted & finite]
    return out, float(kept.min()) if kept.size else np.inf
