"""Numba kernels of the synthetic generator: drawing rows and scoring them.

Counter-based: row ``i`` of a stream is a function of ``(split_key, i)`` only,
so blocks can be drawn anywhere and in any order. Ids are popularity ranks
pushed through a keyed 32-bit permutation (:func:`perm32`, inverted by
:func:`unperm32` when scoring); every effect and latent value is hashed from
(key, id) on the fly.

The kernels release the GIL and are split over a few plain threads per call
(:func:`in_threads`).

>>> keys = np.array([12345, 678], np.uint64)
>>> ranks = np.arange(5, dtype=np.int64)
>>> bool((unpermute(permute(ranks, keys), keys) == ranks).all()) and len(set(permute(ranks, keys))) == 5
True
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

from tierec.data.hashing import HEX_FEATURE_SHIFT, mix64

LATENT_DIM = 4  # rank of the pairwise interaction term
THREADS = min(4, os.cpu_count() or 1)  # threads per kernel call
MIN_ROWS_PER_THREAD = 1024  # smaller calls are not worth a thread
RANK_BINS = 1 << 12  # quantile bins of the rank lookup table (26 features: 426 KB, stays in cache)

_M32 = np.uint64(0xFFFFFFFF)
_C1, _C2 = np.uint64(0x85EBCA6B), np.uint64(0xC2B2AE35)
_C1_INV, _C2_INV = np.uint64(pow(0x85EBCA6B, -1, 1 << 32)), np.uint64(pow(0xC2B2AE35, -1, 1 << 32))
_S16, _S13, _S26, _S32, _S48 = (np.uint64(k) for k in (16, 13, 26, 32, 48))
_U16 = np.uint64(0xFFFF)
_PN_MEAN = 4 * 32767.5  # Irwin-Hall(4) over 16-bit parts: mean and standard deviation
_PN_STD = 65536.0 / math.sqrt(3.0)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ROW_MUL = np.uint64(0xD1B54A32D192ED03)
_S11 = np.uint64(11)


@njit(cache=True, inline="always")
def perm32(r: np.uint64, k1: np.uint64, k2: np.uint64) -> np.uint64:
    """A keyed bijection of 32-bit values (murmur3's fmix32 between two XORs)."""
    h = (r ^ k1) & _M32
    h ^= h >> _S16
    h = (h * _C1) & _M32
    h ^= h >> _S13
    h = (h * _C2) & _M32
    h ^= h >> _S16
    return h ^ k2


@njit(cache=True, inline="always")
def unperm32(v: np.uint64, k1: np.uint64, k2: np.uint64) -> np.uint64:
    """The inverse of :func:`perm32`."""
    h = (v ^ k2) & _M32
    h ^= h >> _S16
    h = (h * _C2_INV) & _M32
    h ^= (h >> _S13) ^ (h >> _S26)
    h = (h * _C1_INV) & _M32
    h ^= h >> _S16
    return h ^ k1


@njit(cache=True, inline="always")
def pseudo_normal(h: np.uint64) -> float:
    """Mean 0, variance 1 (a sum of four 16-bit uniforms)."""
    s = (h & _U16) + ((h >> _S16) & _U16) + ((h >> _S32) & _U16) + (h >> _S48)
    return (float(s) - _PN_MEAN) / _PN_STD


def permute(ranks: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Ranks -> 32-bit id values for one feature (``keys`` = its two uint64 keys)."""
    return _permute_many(ranks.astype(np.uint64), keys[0], keys[1]).astype(np.int64)


def unpermute(values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    return _unpermute_many(values.astype(np.uint64), keys[0], keys[1]).astype(np.int64)


@njit(cache=True)
def _permute_many(r: np.ndarray, k1: np.uint64, k2: np.uint64) -> np.ndarray:
    return np.array([perm32(x, k1, k2) for x in r], dtype=np.uint64)


@njit(cache=True)
def _unpermute_many(v: np.ndarray, k1: np.uint64, k2: np.uint64) -> np.ndarray:
    return np.array([unperm32(x, k1, k2) for x in v], dtype=np.uint64)


@njit(cache=True, nogil=True)
def _score_rows(lo, hi, dense, values, offsets, perm_keys, effect_keys, latent_keys, weights, latent_slot, pairs,
                pair_weights, dense_weights, dense_mean, bias, decay_rank, out):  # fmt: skip
    """Planted logits of rows ``lo..hi-1`` into ``out``."""
    n, n_dense = dense.shape
    n_feat = weights.shape[0]
    u = np.zeros((max(1, latent_slot.max() + 1), LATENT_DIM))  # bag-mean latent vectors of the row
    for i in range(lo, hi):
        z = 0.0
        for j in range(n_dense):
            z += dense_weights[j] * (dense[i, j] - dense_mean[j])
        u[:] = 0.0
        for f in range(n_feat):
            s, e = offsets[f * n + i], offsets[f * n + i + 1]
            if e == s:
                continue
            slot = latent_slot[f]
            acc = 0.0
            for p in range(s, e):
                v = np.uint64(values[p]) & _M32
                rank = float(unperm32(v, perm_keys[f, 0], perm_keys[f, 1]))
                h = decay_rank / (decay_rank + rank)
                acc += h * pseudo_normal(mix64(effect_keys[f] ^ v))
                if slot >= 0:
                    g = mix64(latent_keys[f] ^ v)
                    for q in range(LATENT_DIM):
                        part = float((g >> np.uint64(16 * q)) & _U16)
                        u[slot, q] += h * (part / 65535.0 - 0.5) * 3.4641016151377544  # sqrt(12)
            inv = 1.0 / (e - s)
            z += weights[f] * acc * inv
            if slot >= 0:
                for q in range(LATENT_DIM):
                    u[slot, q] *= inv
        for p in range(pairs.shape[0]):
            dot = 0.0
            for q in range(LATENT_DIM):
                dot += u[pairs[p, 0], q] * u[pairs[p, 1], q]
            z += pair_weights[p] * dot
        out[i] = bias + z


@njit(cache=True, nogil=True, inline="always")
def rank_of(u: float, zc: float, inv: float, mode: int, card: int) -> int:
    """The popularity rank (0 = hottest) at quantile ``u`` of a feature's power law.

    x = (1 + u * c) ** (1 / (1 - s)) is a continuous power law on [1, card + 1)
    (mode 2; mode 1 is exponent 1, mode 0 uniform); the rank is floor(x) - 1.
    """
    if mode == 0:
        x = u * zc
    elif mode == 1:
        x = math.exp(u * zc) - 1.0
    else:
        x = math.exp(math.log1p(u * zc) * inv) - 1.0
    return min(max(np.int64(x), 0), card - 1)


@njit(cache=True, nogil=True)
def rank_table(cards: np.ndarray, zc: np.ndarray, inv: float, mode: int) -> np.ndarray:
    """[F, RANK_BINS + 1] int32: the rank at each bin edge ``b / RANK_BINS`` of every feature.

    Ranks are monotone in u, so a bin whose two edges agree holds a single rank and
    sampling it needs no exp/log; with a Zipf head that is most draws.
    """
    out = np.empty((cards.shape[0], RANK_BINS + 1), np.int32)
    for f in range(cards.shape[0]):
        for b in range(RANK_BINS + 1):
            out[f, b] = rank_of(b / RANK_BINS, zc[f], inv, mode, cards[f])
    return out


@njit(cache=True, nogil=True)
def _draw_rows(lo, hi, start, split_key, cards, zc, inv, mode, table, perm_keys, k, dense_scale, dense, values, u_label):  # fmt: skip
    """Rows ``lo..hi-1`` of a block starting at stream row ``start``."""
    n, n_dense = dense.shape
    n_feat = cards.shape[0]
    for i in range(lo, hi):
        ctr = mix64(split_key + np.uint64(start + i) * _ROW_MUL)  # the row's counter
        for j in range(n_dense):
            ctr += _GOLDEN
            dense[i, j] = dense_scale[j] * abs(pseudo_normal(mix64(ctr)))
        for f in range(n_feat):
            card = cards[f]
            base = np.int64(f) << HEX_FEATURE_SHIFT
            for t in range(k):
                ctr += _GOLDEN
                u = (float(mix64(ctr) >> _S11) + 0.5) * 1.1102230246251565e-16  # (0, 1)
                b = np.int64(u * RANK_BINS)  # exact: RANK_BINS is a power of two
                rank = np.int64(table[f, b])
                if rank != table[f, b + 1]:  # the bin spans several ranks: evaluate the inverse CDF
                    rank = rank_of(u, zc[f], inv, mode, card)
                values[(f * n + i) * k + t] = base | np.int64(perm32(np.uint64(rank), perm_keys[f, 0], perm_keys[f, 1]))
        ctr += _GOLDEN
        u_label[i] = (float(mix64(ctr) >> _S11) + 0.5) * 1.1102230246251565e-16


def draw_kernel(start, split_key, cards, zc, inv, mode, table, perm_keys, k, dense_scale, dense, values, u_label) -> None:  # fmt: skip
    """Fill ``dense`` [n, D], ``values`` [F * n * k] and ``u_label`` [n] for stream rows ``start..start+n-1``."""
    args = (start, split_key, cards, zc, inv, mode, table, perm_keys, k, dense_scale, dense, values, u_label)
    in_threads(_draw_rows, dense.shape[0], args)


def score_kernel(dense, values, offsets, perm_keys, effect_keys, latent_keys, weights, latent_slot, pairs,
                 pair_weights, dense_weights, dense_mean, bias, decay_rank, out) -> None:  # fmt: skip
    """Planted logits [n] of rows given ``dense`` [n, D] and feature-major bags (``values``, ``offsets``)."""
    args = (dense, values, offsets, perm_keys, effect_keys, latent_keys, weights, latent_slot, pairs, pair_weights,
            dense_weights, dense_mean, bias, decay_rank, out)  # fmt: skip
    in_threads(_score_rows, dense.shape[0], args)


def in_threads(kernel: Callable[..., None], n: int, args: tuple[Any, ...]) -> None:
    """Run ``kernel(lo, hi, *args)`` over ``0..n`` split across up to ``THREADS`` threads.

    The kernels release the GIL, so plain threads run them in parallel; the caller
    takes the last share itself. (Not numba ``prange``: its OpenMP pool busy-waits,
    which collapses on a shared, oversubscribed machine, and its workqueue pool
    aborts when two threads launch kernels at once.)
    """
    parts = max(1, min(THREADS, n // MIN_ROWS_PER_THREAD))
    bounds = [n * p // parts for p in range(parts + 1)]
    threads = [
        threading.Thread(target=kernel, args=(bounds[p], bounds[p + 1], *args), name="tierec-synth", daemon=True)
        for p in range(parts - 1)
    ]
    for t in threads:
        t.start()
    kernel(bounds[-2], bounds[-1], *args)
    for t in threads:
        t.join()
