"""Numba kernels of the pruned store: gather + pool through chunk maps, chunked fused optimizers.

A row ``r`` owns chunk positions ``0..K-1``; ``cmap[r, q]`` is the physical
chunk of position ``q`` or -1, and the live positions are always a prefix, so
every loop stops at the first -1 and the dims past it read as zeros.

The per-element arithmetic of every optimizer is written exactly as in
tierec/embedding/optimizers.py, in the same order and types, so an unpruned
PrunedGroup computes bit-identical weights to a TableGroup. The update kernels
also accumulate each chunk's importance: ``||g_chunk||`` of the row's batch
gradient (or, for the frequency baseline, ``hits[i]``, the row's accesses in the
batch) into the live chunk, and into ``next_imp[r]`` for the
first pruned position (its claim to grow back).

>>> import numpy as np
>>> cmap = np.array([[4, 5, -1], [7, 2, -1], [-1, -1, -1]], dtype=np.int32)  # 3 rows, 3 positions
>>> start, length = np.empty(3, dtype=np.int64), np.empty(3, dtype=np.int64)
>>> row_segments(cmap, np.array([0, 1, 2]), start, length)
>>> start.tolist(), length.tolist()  # row 0 in one run, row 1 scattered, row 2 empty
([4, 7, -1], [2, -2, 0])
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numba as nb
import numpy as np

from tierec.embedding.kernels import key_hash


@nb.njit(inline="always", cache=True)
def _score(g, i, base, c, by_grad, hits):
    if not by_grad:
        return hits[i]
    acc = np.float32(0.0)
    for j in range(c):
        x = g[i, base + j]
        acc += x * x
    return np.float32(np.sqrt(acc))


@nb.njit(inline="always", cache=True)
def _importance(g, i, r, ln, st, cmap, c, n_pos, imp, next_imp, by_grad, hits):
    """Adds each live chunk's score to its importance and the first pruned one's to next_imp."""
    live = ln if ln > 0 else -ln
    for q in range(live):
        p = st + q if ln > 0 else cmap[r, q]
        imp[p] += _score(g, i, q * c, c, by_grad, hits)
    if live < n_pos:
        next_imp[r] += _score(g, i, live * c, c, by_grad, hits)
    return live


@nb.njit(parallel=True, cache=True)
def gather_rows(pw, cmap, rows, out):
    """out[u] = row rows[u] as a dense vector, zeros past its prefix (and for rows -1). out [U, K*c]."""
    c = pw.shape[1]
    n_pos = cmap.shape[1]
    for u in nb.prange(rows.shape[0]):
        r = rows[u]
        for j in range(out.shape[1]):
            out[u, j] = 0.0
        if r < 0:
            continue
        for q in range(n_pos):
            p = cmap[r, q]
            if p < 0:
                break
            for j in range(c):
                out[u, q * c + j] = pw[p, j]


@nb.njit(parallel=True, cache=True)
def scatter_rows(pw, cmap, rows, values):
    """Write dense ``values`` [U, K*c] into the live chunks of ``rows``; dims past a prefix are dropped."""
    c = pw.shape[1]
    n_pos = cmap.shape[1]
    for u in nb.prange(rows.shape[0]):
        r = rows[u]
        for q in range(n_pos):
            p = cmap[r, q]
            if p < 0:
                break
            for j in range(c):
                pw[p, j] = values[u, q * c + j]


# ------------------------------------------------------- hot kernels, per chunk size


class HotKernels(NamedTuple):
    """The per-batch kernels; see ``hot_kernels``."""

    pool_forward: Callable
    sgd: Callable
    adagrad: Callable
    rowwise_adagrad: Callable
    adam: Callable


def _build(CHUNK: int) -> HotKernels:
    """The hot kernels with the chunk size a compile-time constant (0 = read it from the pool).

    Each takes the batch's row segments (``row_segments``): a row whose live chunks sit
    one after another in the pool (the usual case: compaction lays rows out in order)
    is read and updated as one flat run of dims, which vectorises like a dense row;
    other rows go chunk by chunk through the chunk map. A constant chunk size lets LLVM
    unroll the per-chunk loops. Per element, the arithmetic and its order are those of
    tierec/embedding/optimizers.py.
    """

    def pool_forward(pw, cmap, rows, start, length, inverse, offsets, bag_scale, batch, out):
        """out[b, f] = bag_scale * sum over the bag's ids of the row read through its chunks.

        pw [P, c]; cmap [R, K] int32; rows, start, length [U] (``row_segments``; rows -1
        and rows without chunks read as zeros); inverse [N]; offsets [F*B+1];
        bag_scale [F*B] float32; out [B, F, K*c].
        """
        c = pw.shape[1] if CHUNK == 0 else CHUNK
        flat = pw.reshape(pw.shape[0] * pw.shape[1])
        d = out.shape[2]
        n_bags = offsets.shape[0] - 1
        for k in nb.prange(n_bags):
            f = k // batch
            b = k - f * batch
            for j in range(d):
                out[b, f, j] = 0.0
            for i in range(offsets[k], offsets[k + 1]):
                u = inverse[i]
                ln = length[u]
                if ln > 0:
                    # a slice: indices known non-negative, so the loop vectorises like a dense row's
                    run = flat[start[u] * c : (start[u] + ln) * c]
                    for j in range(run.shape[0]):
                        out[b, f, j] += run[j]
                elif ln < 0:
                    r = rows[u]
                    for q in range(-ln):
                        p = cmap[r, q]
                        for j in range(c):
                            out[b, f, q * c + j] += pw[p, j]
            s = bag_scale[k]
            if s != 1.0:
                for j in range(d):
                    out[b, f, j] *= s

    def sgd(pw, cmap, rows, start, length, g, lr, wd, imp, next_imp, by_grad, hits):
        c = pw.shape[1] if CHUNK == 0 else CHUNK
        flat = pw.reshape(pw.shape[0] * pw.shape[1])
        for i in nb.prange(rows.shape[0]):
            r, ln = rows[i], length[i]
            live = _importance(g, i, r, ln, start[i], cmap, c, cmap.shape[1], imp, next_imp, by_grad, hits)
            if ln > 0:
                w = flat[start[i] * c : (start[i] + live) * c]
                for j in range(w.shape[0]):
                    w[j] -= lr * (g[i, j] + wd * w[j])
            else:
                for q in range(live):
                    p = cmap[r, q]
                    for j in range(c):
                        pw[p, j] -= lr * (g[i, q * c + j] + wd * pw[p, j])

    def adagrad(pw, s, cmap, rows, start, length, g, lr, eps, wd, imp, next_imp, by_grad, hits):
        c = pw.shape[1] if CHUNK == 0 else CHUNK
        flat = pw.reshape(pw.shape[0] * pw.shape[1])
        sflat = s.reshape(s.shape[0] * s.shape[1])
        for i in nb.prange(rows.shape[0]):
            r, ln = rows[i], length[i]
            live = _importance(g, i, r, ln, start[i], cmap, c, cmap.shape[1], imp, next_imp, by_grad, hits)
            if ln > 0:
                lo, hi = start[i] * c, (start[i] + live) * c
                w, ss = flat[lo:hi], sflat[lo:hi]
                for j in range(w.shape[0]):
                    gj = g[i, j] + wd * w[j]
                    ss[j] += gj * gj
                    w[j] -= lr * gj / (np.sqrt(ss[j]) + eps)
            else:
                for q in range(live):
                    p = cmap[r, q]
                    for j in range(c):
                        gj = g[i, q * c + j] + wd * pw[p, j]
                        s[p, j] += gj * gj
                        pw[p, j] -= lr * gj / (np.sqrt(s[p, j]) + eps)

    def rowwise_adagrad(pw, s_row, cmap, rows, start, length, g, lr, eps, wd, d, imp, next_imp, by_grad, hits):
        """``s_row`` [R] stays with the row; the mean square is over all ``d`` dims (pruned ones add 0)."""
        c = pw.shape[1] if CHUNK == 0 else CHUNK
        flat = pw.reshape(pw.shape[0] * pw.shape[1])
        for i in nb.prange(rows.shape[0]):
            r, ln = rows[i], length[i]
            live = _importance(g, i, r, ln, start[i], cmap, c, cmap.shape[1], imp, next_imp, by_grad, hits)
            acc = np.float32(0.0)
            if ln > 0:
                w = flat[start[i] * c : (start[i] + live) * c]
                for j in range(w.shape[0]):
                    gj = g[i, j] + wd * w[j]
                    acc += gj * gj
            else:
                for q in range(live):
                    p = cmap[r, q]
                    for j in range(c):
                        gj = g[i, q * c + j] + wd * pw[p, j]
                        acc += gj * gj
            s_row[r] += acc / d
            scale = lr / (np.sqrt(s_row[r]) + eps)
            if ln > 0:
                w = flat[start[i] * c : (start[i] + live) * c]
                for j in range(w.shape[0]):
                    w[j] -= scale * (g[i, j] + wd * w[j])
            else:
                for q in range(live):
                    p = cmap[r, q]
                    for j in range(c):
                        pw[p, j] -= scale * (g[i, q * c + j] + wd * pw[p, j])

    def adam(pw, m, v, cmap, rows, start, length, g, step_size, b1, b2, eps, wd, imp, next_imp, by_grad, hits):
        c = pw.shape[1] if CHUNK == 0 else CHUNK
        flat = pw.reshape(pw.shape[0] * pw.shape[1])
        mflat = m.reshape(m.shape[0] * m.shape[1])
        vflat = v.reshape(v.shape[0] * v.shape[1])
        for i in nb.prange(rows.shape[0]):
            r, ln = rows[i], length[i]
            live = _importance(g, i, r, ln, start[i], cmap, c, cmap.shape[1], imp, next_imp, by_grad, hits)
            if ln > 0:
                lo, hi = start[i] * c, (start[i] + live) * c
                w, mm, vv = flat[lo:hi], mflat[lo:hi], vflat[lo:hi]
                for j in range(w.shape[0]):
                    gj = g[i, j] + wd * w[j]
                    mm[j] += (gj - mm[j]) * (1 - b1)
                    vv[j] += (gj * gj - vv[j]) * (1 - b2)
                    w[j] -= step_size * mm[j] / (np.sqrt(vv[j]) + eps)
            else:
                for q in range(live):
                    p = cmap[r, q]
                    for j in range(c):
                        gj = g[i, q * c + j] + wd * pw[p, j]
                        m[p, j] += (gj - m[p, j]) * (1 - b1)
                        v[p, j] += (gj * gj - v[p, j]) * (1 - b2)
                        pw[p, j] -= step_size * m[p, j] / (np.sqrt(v[p, j]) + eps)

    suffix = f"c{CHUNK}" if CHUNK else "any"
    built = []
    for f in (pool_forward, sgd, adagrad, rowwise_adagrad, adam):
        f.__qualname__ = f"{f.__name__}_{suffix}"  # one cache entry per chunk size
        built.append(nb.njit(parallel=True, cache=True)(f))
    return HotKernels(*built)


_SPECIALISED = {c: _build(c) for c in (1, 2, 4, 8, 16)}  # compiled on first use, then cached on disk
_ANY_CHUNK = _build(0)


def hot_kernels(chunk: int) -> HotKernels:
    """Kernels specialised for ``chunk`` dims per chunk (1, 2, 4, 8, 16), else generic ones."""
    return _SPECIALISED.get(chunk, _ANY_CHUNK)


# ------------------------------------------------------------------ bookkeeping


@nb.njit(parallel=True, cache=True)
def row_segments(cmap, rows, start, length):
    """Where each of a batch's rows [U] lives: ``start[u]`` its first chunk; ``length[u]`` its
    live chunks when they are consecutive in the pool, minus that when they are scattered,
    0 when it has none (or ``rows[u]`` is -1)."""
    n_pos = cmap.shape[1]
    for u in nb.prange(rows.shape[0]):
        r = rows[u]
        start[u] = -1
        length[u] = 0
        if r < 0:
            continue
        p0 = cmap[r, 0]
        if p0 < 0:
            continue
        live = 1
        together = True
        while live < n_pos and cmap[r, live] >= 0:
            if cmap[r, live] != p0 + live:
                together = False
            live += 1
        start[u] = p0
        length[u] = live if together else -live


@nb.njit(cache=True)
def row_scores(cmap, n_rows, imp, next_imp, min_chunks, regrow, margin, out):
    """Keep-scores of every chunk position, for one threshold to cut.

    out [n_rows, K]: position q of row r is kept at threshold t iff out[r, q] >= t.
    Live positions get the largest importance at or after them (a row keeps a
    prefix, so a chunk is kept while any later one is); the first pruned
    position gets next_imp / margin when ``regrow``; later ones -inf; positions
    below ``min_chunks`` +inf.
    """
    n_pos = cmap.shape[1]
    for r in range(n_rows):
        live = 0
        while live < n_pos and cmap[r, live] >= 0:
            live += 1
        best = -np.inf
        if live < n_pos and regrow:
            best = next_imp[r] / margin
            out[r, live] = best
        for q in range(live + 1, n_pos):
            out[r, q] = -np.inf
        if live < n_pos and not regrow:
            out[r, live] = -np.inf
        for q in range(live - 1, -1, -1):
            x = imp[cmap[r, q]]
            if x > best:
                best = x
            out[r, q] = best
        for q in range(min(min_chunks, n_pos)):
            out[r, q] = np.inf


@nb.njit(cache=True)
def live_chunks(cmap, n_rows, out):
    """out[r] = number of live chunk positions of row r (the length of its prefix)."""
    n_pos = cmap.shape[1]
    for r in range(n_rows):
        live = 0
        while live < n_pos and cmap[r, live] >= 0:
            live += 1
        out[r] = live


@nb.njit(cache=True)
def tie_keys(row_keys, row_tabs, out):
    """out[r] = hash of row r's (table, id): an order for ties that survives renumbering."""
    for r in range(out.shape[0]):
        out[r] = key_hash(np.int32(row_tabs[r]), row_keys[r])
