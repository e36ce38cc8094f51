"""Numba kernels of the pruned store: gather + pool through chunk maps, chunked fused optimizers.

A row ``r`` owns chunk positions ``0..K-1``; ``cmap[r, q]`` is the physical
chunk of position ``q`` or -1, and the live positions are always a prefix, so
every loop stops at the first -1 and the dims past it read as zeros.

The per-element arithmetic of every optimizer is written exactly as in
tierec/embedding/optimizers.py, in the same order and types, so an unpruned
PrunedGroup computes bit-identical weights to a TableGroup. The update kernels
also accumulate each chunk's importance: ``||g_chunk||`` (or 1 per access for
the frequency baseline) into the live chunk, and into ``next_imp[r]`` for the
first pruned position (its claim to grow back).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from tierec.embedding.kernels import key_hash


@nb.njit(parallel=True, cache=True)
def pool_forward(pw, cmap, rows, inverse, offsets, bag_scale, batch, out):
    """out[b, f] = bag_scale * sum over the bag's ids of the row read through its chunk map.

    pw [P, c]; cmap [R, K] int32; rows [U] (-1 reads as zeros); inverse [N];
    offsets [F*B+1]; bag_scale [F*B] float32; out [B, F, K*c].
    """
    c = pw.shape[1]
    n_pos = cmap.shape[1]
    d = out.shape[2]
    n_bags = offsets.shape[0] - 1
    for k in nb.prange(n_bags):
        f = k // batch
        b = k - f * batch
        for j in range(d):
            out[b, f, j] = 0.0
        for i in range(offsets[k], offsets[k + 1]):
            r = rows[inverse[i]]
            if r >= 0:
                for q in range(n_pos):
                    p = cmap[r, q]
                    if p < 0:
                        break
                    base = q * c
                    for j in range(c):
                        out[b, f, base + j] += pw[p, j]
        s = bag_scale[k]
        if s != 1.0:
            for j in range(d):
                out[b, f, j] *= s


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


@nb.njit(inline="always", cache=True)
def _score(g, i, base, c, by_grad):
    if not by_grad:
        return np.float32(1.0)
    acc = np.float32(0.0)
    for j in range(c):
        x = g[i, base + j]
        acc += x * x
    return np.float32(np.sqrt(acc))


# ------------------------------------------------------------------ optimizers


@nb.njit(parallel=True, cache=True)
def sgd(pw, cmap, rows, g, lr, wd, imp, next_imp, by_grad):
    c = pw.shape[1]
    for i in nb.prange(rows.shape[0]):
        r = rows[i]
        for q in range(cmap.shape[1]):
            p = cmap[r, q]
            base = q * c
            if p < 0:
                next_imp[r] += _score(g, i, base, c, by_grad)
                break
            imp[p] += _score(g, i, base, c, by_grad)
            for j in range(c):
                pw[p, j] -= lr * (g[i, base + j] + wd * pw[p, j])


@nb.njit(parallel=True, cache=True)
def adagrad(pw, s, cmap, rows, g, lr, eps, wd, imp, next_imp, by_grad):
    c = pw.shape[1]
    for i in nb.prange(rows.shape[0]):
        r = rows[i]
        for q in range(cmap.shape[1]):
            p = cmap[r, q]
            base = q * c
            if p < 0:
                next_imp[r] += _score(g, i, base, c, by_grad)
                break
            imp[p] += _score(g, i, base, c, by_grad)
            for j in range(c):
                gj = g[i, base + j] + wd * pw[p, j]
                s[p, j] += gj * gj
                pw[p, j] -= lr * gj / (np.sqrt(s[p, j]) + eps)


@nb.njit(parallel=True, cache=True)
def rowwise_adagrad(pw, s_row, cmap, rows, g, lr, eps, wd, d, imp, next_imp, by_grad):
    """``s_row`` [R] stays with the row; the mean square is over all ``d`` dims (pruned ones add 0)."""
    c = pw.shape[1]
    for i in nb.prange(rows.shape[0]):
        r = rows[i]
        acc = np.float32(0.0)
        for q in range(cmap.shape[1]):
            p = cmap[r, q]
            base = q * c
            if p < 0:
                next_imp[r] += _score(g, i, base, c, by_grad)
                break
            imp[p] += _score(g, i, base, c, by_grad)
            for j in range(c):
                gj = g[i, base + j] + wd * pw[p, j]
                acc += gj * gj
        s_row[r] += acc / d
        scale = lr / (np.sqrt(s_row[r]) + eps)
        for q in range(cmap.shape[1]):
            p = cmap[r, q]
            if p < 0:
                break
            base = q * c
            for j in range(c):
                pw[p, j] -= scale * (g[i, base + j] + wd * pw[p, j])


@nb.njit(parallel=True, cache=True)
def adam(pw, m, v, cmap, rows, g, step_size, b1, b2, eps, wd, imp, next_imp, by_grad):
    c = pw.shape[1]
    for i in nb.prange(rows.shape[0]):
        r = rows[i]
        for q in range(cmap.shape[1]):
            p = cmap[r, q]
            base = q * c
            if p < 0:
                next_imp[r] += _score(g, i, base, c, by_grad)
                break
            imp[p] += _score(g, i, base, c, by_grad)
            for j in range(c):
                gj = g[i, base + j] + wd * pw[p, j]
                m[p, j] += (gj - m[p, j]) * (1 - b1)
                v[p, j] += (gj * gj - v[p, j]) * (1 - b2)
                pw[p, j] -= step_size * m[p, j] / (np.sqrt(v[p, j]) + eps)


# ------------------------------------------------------------------ bookkeeping


@nb.njit(cache=True)
def remap_chunks(cmap, n_rows, first_moved, moved_to):
    """After compaction: chunk ``p >= first_moved`` now lives at ``moved_to[p - first_moved]``."""
    for r in range(n_rows):
        for q in range(cmap.shape[1]):
            p = cmap[r, q]
            if p < 0:
                break
            if p >= first_moved:
                cmap[r, q] = moved_to[p - first_moved]


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
