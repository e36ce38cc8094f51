"""Fused gather + pool on CPU, and its backward onto unique rows.

The forward reads each id's row straight from the table and sums it into the
sample's output slot ``out[b, f, :]``: no ``[U, D]`` copy of the unique rows
and no ``[B, F, D]`` reshuffle afterwards. The backward reduces the output
gradient onto the unique rows; it splits the columns between threads, so no
two threads ever add into the same element and no atomics are needed. The
optimizer then updates the unique rows (optimizers.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from tierec.embedding.prefetch import AHEAD, prefetch_at, prefetch_row


@nb.njit(parallel=True, cache=True)
def pool_forward(weights, rows, inverse, offsets, bag_scale, batch, out):
    """out[b, f] = bag_scale[f*B+b] * sum of weights[rows[inverse[i]]] over the bag's ids.

    weights [R, D]; rows [U] (-1 reads as zeros); inverse [N]; offsets [F*B+1];
    bag_scale [F*B] float32; out [B, F, D].
    """
    d = weights.shape[1]
    n_bags = offsets.shape[0] - 1
    n = inverse.shape[0]
    for k in nb.prange(n_bags):
        f = k // batch
        b = k - f * batch
        if k + AHEAD < n_bags:  # the output slot of the bag AHEAD on (bags are feature-major,
            ka = k + AHEAD  # so consecutive bags write B*F*D floats apart: a miss each)
            fa = ka // batch
            prefetch_at(out, ka - fa * batch, fa)
        for j in range(d):
            out[b, f, j] = 0.0
        for i in range(offsets[k], offsets[k + 1]):
            if i + AHEAD < n:  # announce the row AHEAD ids on: its cache miss overlaps this work
                ra = rows[inverse[i + AHEAD]]
                if ra >= 0:
                    prefetch_row(weights, ra)
            r = rows[inverse[i]]
            if r >= 0:
                for j in range(d):
                    out[b, f, j] += weights[r, j]
        s = bag_scale[k]
        if s != 1.0:
            for j in range(d):
                out[b, f, j] *= s


@nb.njit(parallel=True, cache=True)
def pool_backward(grad_out, inverse, offsets, bag_scale, batch, n_chunks, grad_rows):
    """grad_rows[u] = sum over ids i with inverse[i] == u of bag_scale * grad_out[b, f].

    grad_out [B, F, D]; grad_rows [U, D] zero-initialised. Thread c owns one
    contiguous block of columns.
    """
    d = grad_rows.shape[1]
    n_bags = offsets.shape[0] - 1
    for c in nb.prange(n_chunks):
        lo = c * d // n_chunks
        hi = (c + 1) * d // n_chunks
        for k in range(n_bags):
            f = k // batch
            b = k - f * batch
            if k + AHEAD < n_bags:  # the output gradient of the bag AHEAD on (a strided read)
                fa = (k + AHEAD) // batch
                prefetch_at(grad_out, k + AHEAD - fa * batch, fa)
            s = bag_scale[k]
            for i in range(offsets[k], offsets[k + 1]):
                u = inverse[i]
                for j in range(lo, hi):
                    grad_rows[u, j] += s * grad_out[b, f, j]


@nb.njit(parallel=True, cache=True)
def pool_backward_by_feature(grad_out, inverse, offsets, bag_scale, batch, bounds, grad_rows):
    """``pool_backward`` split between threads by feature instead of by column.

    Valid only when no unique row is used by two features (one table per feature in the
    group): thread p reduces the bags of features bounds[p] .. bounds[p+1]-1 over all
    columns, so every row is written by one thread only, in the same ascending-id order
    as ``pool_backward`` (bitwise the same sums). At dim 16 a row is one cache line, which
    the column split makes two threads write at once.
    """
    d = grad_rows.shape[1]
    for p in nb.prange(bounds.shape[0] - 1):
        for k in range(bounds[p] * batch, bounds[p + 1] * batch):
            f = k // batch
            b = k - f * batch
            if k + AHEAD < bounds[p + 1] * batch:  # the output gradient of the bag AHEAD on
                fa = (k + AHEAD) // batch
                prefetch_at(grad_out, k + AHEAD - fa * batch, fa)
            s = bag_scale[k]
            for i in range(offsets[k], offsets[k + 1]):
                u = inverse[i]
                for j in range(d):
                    grad_rows[u, j] += s * grad_out[b, f, j]


def feature_bounds(offsets: np.ndarray, batch: int, parts: int) -> np.ndarray:
    """[parts' + 1] feature boundaries splitting the ids about evenly (whole features per part)."""
    n_features = (offsets.shape[0] - 1) // batch
    ids_before = offsets[np.arange(n_features + 1) * batch]  # ids before each feature
    targets = ids_before[-1] * np.arange(1, parts) / parts
    cuts = np.searchsorted(ids_before, targets)
    return np.unique(np.concatenate([[0], np.clip(cuts, 0, n_features), [n_features]])).astype(np.int64)


def backward_chunks(dim: int) -> int:
    """How many column chunks (threads) the backward uses."""
    return max(1, min(nb.get_num_threads(), dim))


def bag_scale(offsets: np.ndarray, mean_per_feature: np.ndarray, batch: int) -> np.ndarray:
    """Per-bag multiplier [F*B] float32: 1 for sum pooling, 1/len for mean (empty bags stay 0)."""
    scale = np.ones(offsets.shape[0] - 1, dtype=np.float32)
    if mean_per_feature.any():
        lengths = np.maximum(np.diff(offsets), 1).astype(np.float32)
        is_mean = np.repeat(mean_per_feature, batch)
        scale[is_mean] = 1.0 / lengths[is_mean]
    return scale


# Where the row-parallel reduce + update (``reduce_update_rowwise``) beats pool_backward + the
# optimizer pass, measured A/B in one process (docs/performance.md, benchmarks.fused_backward):
# its serial counting sort that groups ids by row is a fixed cost, the zero-fill and second pass
# it saves grow with the dim and shrink with wider vectors. Since both passes prefetch their rows
# it pays on one host type as on the other only on several threads, against the two-pass backward
# split by column (tables shared by features), from a minimum dim: AVX2 (Zen 3, 2026-11-24) 1.27x
# at dim 32 and 1.81x at 64, 0.91x at 16; AVX-512 1.81x at 64, 0.80x at 32. It loses on one
# thread (AVX2: 0.74x at dim 16, 1.04x at 64; AVX-512: 0.71x at 16, 0.90x at 64) and against the
# split by feature (``pool_backward_by_feature``, every feature with its own table) at every dim
# (AVX2 2 threads: 0.70x at 16, 0.65x at 32, 0.87x at 64; AVX-512 0.80x at 64).
FUSED_MIN_DIM = 32  # without AVX-512
FUSED_MIN_DIM_AVX512 = 64  # with AVX-512


def fused_pays(dim: int, threads: int, avx512: bool, features_own_rows: bool = False) -> bool:
    """Whether the fused row-parallel pass is the faster one for this dim, thread count and host.

    ``features_own_rows``: the two-pass backward could split by feature (one table per feature).
    """
    return threads > 1 and not features_own_rows and dim >= (FUSED_MIN_DIM_AVX512 if avx512 else FUSED_MIN_DIM)


def host_has_avx512() -> bool:
    """True when the CPU numba compiles for has AVX-512 (foundation subset)."""
    import llvmlite.binding as ll

    return bool(ll.get_host_cpu_features().get("avx512f", False))


@nb.njit(parallel=True, cache=True)
def _ids_by_row(inverse, offsets, n_rows, n_parts):
    """CSR of ids per unique row, ids ascending within a row: (start [U+1], ids [N], bag of each id [N]).

    A counting sort in ``n_parts`` contiguous slices of the ids, each counted and
    scattered by its own thread; slice p's ids land after slice p-1's within every
    row, so each row's ids stay ascending.
    """
    n = inverse.shape[0]
    bag = np.empty(n, dtype=np.int32)
    for k in nb.prange(offsets.shape[0] - 1):
        for i in range(offsets[k], offsets[k + 1]):
            bag[i] = k
    counts = np.zeros((n_parts, n_rows), dtype=np.int32)
    for p in nb.prange(n_parts):
        for i in range(p * n // n_parts, (p + 1) * n // n_parts):
            counts[p, inverse[i]] += 1
    start = np.empty(n_rows + 1, dtype=np.int64)
    run = 0
    for u in range(n_rows):
        start[u] = run
        for p in range(n_parts):
            c = counts[p, u]
            counts[p, u] = run  # becomes slice p's next position in row u
            run += c
    start[n_rows] = run
    ids = np.empty(n, dtype=np.int32)
    for p in nb.prange(n_parts):
        for i in range(p * n // n_parts, (p + 1) * n // n_parts):
            u = inverse[i]
            ids[counts[p, u]] = i
            counts[p, u] += 1
    return start, ids, bag


@nb.njit(parallel=True, cache=True)
def reduce_update_rowwise(grad_out, inverse, offsets, bag_scale, batch, rows, w, s, lr, eps, wd, n_blocks, n_parts):
    """``pool_backward`` and the row-wise Adagrad update in one pass, parallel over unique rows.

    Each unique row sums its ids' output gradients in ascending id order (the
    order ``pool_backward`` adds them in, so the sums are bitwise the same) into
    a scratch vector and is updated at once with the arithmetic of
    ``optimizers._rowwise_adagrad``: no ``[U, D]`` gradient is zero-filled,
    written and read again, and no two threads touch the same row.
    """
    d = w.shape[1]
    n_rows = rows.shape[0]
    start, ids, bag = _ids_by_row(inverse, offsets, n_rows, n_parts)
    for blk in nb.prange(n_blocks):
        acc = np.empty(d, dtype=np.float32)
        hi = (blk + 1) * n_rows // n_blocks
        for u in range(blk * n_rows // n_blocks, hi):
            if u + AHEAD < hi:
                prefetch_row(w, rows[u + AHEAD])
                prefetch_row(s, rows[u + AHEAD])
            for j in range(d):
                acc[j] = 0.0
            for p in range(start[u], start[u + 1]):
                k = bag[ids[p]]
                f = k // batch
                b = k - f * batch
                sc = bag_scale[k]
                for j in range(d):
                    acc[j] += sc * grad_out[b, f, j]
            r = rows[u]
            sq = np.float32(0.0)
            for j in range(d):
                gj = acc[j] + wd * w[r, j]
                sq += gj * gj
            s[r] += sq / d
            scale = lr / (np.sqrt(s[r]) + eps)
            for j in range(d):
                w[r, j] -= scale * (acc[j] + wd * w[r, j])
