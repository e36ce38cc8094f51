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


@nb.njit(parallel=True, cache=True)
def pool_forward(weights, rows, inverse, offsets, bag_scale, batch, out):
    """out[b, f] = bag_scale[f*B+b] * sum of weights[rows[inverse[i]]] over the bag's ids.

    weights [R, D]; rows [U] (-1 reads as zeros); inverse [N]; offsets [F*B+1];
    bag_scale [F*B] float32; out [B, F, D].
    """
    d = weights.shape[1]
    n_bags = offsets.shape[0] - 1
    for k in nb.prange(n_bags):
        f = k // batch
        b = k - f * batch
        for j in range(d):
            out[b, f, j] = 0.0
        for i in range(offsets[k], offsets[k + 1]):
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
            s = bag_scale[k]
            for i in range(offsets[k], offsets[k + 1]):
                u = inverse[i]
                for j in range(lo, hi):
                    grad_rows[u, j] += s * grad_out[b, f, j]


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
