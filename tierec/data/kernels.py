"""Numba kernels that turn Arrow string columns into labels, dense floats and ids.

Each kernel takes one column as its Arrow buffers (``offsets`` int32/int64 of
``n + 1`` entries, ``data`` uint8) and writes one output column. A row whose value
cannot be parsed gets ``err[i] = code`` (the first problem of a row wins) so the
caller can drop it and say which column was wrong; parsing never stops on a bad
row. All kernels release the GIL (``nogil``) so loading overlaps compute.

>>> import numpy as np
>>> data = np.frombuffer(b"12-3x", dtype=np.uint8); offsets = np.array([0, 2, 4, 5])
>>> out = np.zeros((3, 1), np.float32); err = np.zeros(3, np.int32)
>>> dense_column(offsets, data, out, 0, False, err, 7)
>>> out[:, 0].tolist(), err.tolist()
([12.0, -3.0, 0.0], [0, 0, 7])
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from tierec.data.hashing import HEX_FEATURE_SHIFT, HEX_MISSING, finish_hash, fnv1a

OK, MISSING, BAD = 0, 1, 2
_POW10 = np.array([10.0**k for k in range(23)])


@njit(cache=True, nogil=True)
def parse_number(data: np.ndarray, s: int, e: int) -> tuple[float, int]:
    """Parse ``[+-]digits[.digits][(e|E)[+-]digits]``; empty or "nan" is MISSING."""
    while s < e and data[s] == 32:
        s += 1
    while e > s and data[e - 1] == 32:
        e -= 1
    if s == e:
        return 0.0, MISSING
    if e - s == 3 and (data[s] | 32) == 110 and (data[s + 1] | 32) == 97 and (data[s + 2] | 32) == 110:
        return 0.0, MISSING
    neg = False
    c = data[s]
    if c == 45 or c == 43:  # - +
        neg = c == 45
        s += 1
    mant = 0
    ndig = 0
    exp10 = 0
    any_digit = False
    while s < e and 48 <= data[s] <= 57:
        any_digit = True
        if ndig < 18:
            mant = mant * 10 + (data[s] - 48)
            if mant:
                ndig += 1
        else:
            exp10 += 1
        s += 1
    if s < e and data[s] == 46:  # .
        s += 1
        while s < e and 48 <= data[s] <= 57:
            any_digit = True
            if ndig < 18:
                mant = mant * 10 + (data[s] - 48)
                if mant:
                    ndig += 1
                exp10 -= 1
            s += 1
    if not any_digit:
        return 0.0, BAD
    if s < e and (data[s] | 32) == 101:  # e E
        s += 1
        eneg = False
        if s < e and (data[s] == 45 or data[s] == 43):
            eneg = data[s] == 45
            s += 1
        if s == e:
            return 0.0, BAD
        ev = 0
        while s < e and 48 <= data[s] <= 57:
            if ev < 100000:
                ev = ev * 10 + (data[s] - 48)
            s += 1
        exp10 += -ev if eneg else ev
    if s != e:
        return 0.0, BAD
    v = float(mant)
    if exp10 > 0:
        v = v * (_POW10[exp10] if exp10 < 23 else 10.0**exp10)
    elif exp10 < 0:
        v = v / (_POW10[-exp10] if exp10 > -23 else 10.0 ** (-exp10))
    if not math.isfinite(v):
        return 0.0, BAD
    return (-v if neg else v), OK


def _hex_table() -> np.ndarray:
    table = np.full(256, -1, np.int64)  # byte -> hex digit value, -1 if not a hex digit
    for i, c in enumerate(b"0123456789abcdef"):
        table[c] = i
    for i, c in enumerate(b"ABCDEF"):
        table[c] = 10 + i
    return table


_HEX = _hex_table()  # a constant for numba


@njit(cache=True, nogil=True, inline="always")
def parse_hex(data: np.ndarray, s: int, e: int) -> tuple[int, int]:
    """Parse 1-8 hex digits into a value below 2**32; empty is MISSING."""
    if s == e:
        return 0, MISSING
    v = 0
    bad = e - s > 8
    for k in range(s, e):  # branch-free: table lookup, OR-ing the "not hex" flags
        d = _HEX[data[k]]
        bad |= d < 0
        v = (v << 4) | d
    if bad:
        return 0, BAD
    return v, OK


@njit(cache=True, nogil=True)
def label_column(offsets: np.ndarray, data: np.ndarray, out: np.ndarray, err: np.ndarray, code: int, threshold: float) -> None:
    """Labels must be numbers in [0, 1], or with a ``threshold`` (not nan) any number (>= threshold -> 1); ``out`` is [n] float32."""
    for i in range(out.shape[0]):
        v, st = parse_number(data, offsets[i], offsets[i + 1])
        if st == OK and threshold == threshold:  # (nan: no threshold)
            v = 1.0 if v >= threshold else 0.0
        if st != OK or v < 0.0 or v > 1.0:
            if err[i] == 0:
                err[i] = code
            v = 0.0
        out[i] = v


@njit(cache=True, nogil=True)
def dense_column(
    offsets: np.ndarray, data: np.ndarray, out: np.ndarray, col: int, log1p: bool, err: np.ndarray, code: int
) -> None:
    """Column ``col`` of ``out`` [n, n_dense] float32; missing is 0, log1p applies log(1 + max(x, 0))."""
    for i in range(out.shape[0]):
        v, st = parse_number(data, offsets[i], offsets[i + 1])
        if st == BAD:
            if err[i] == 0:
                err[i] = code
            v = 0.0
        if log1p:
            v = math.log1p(v) if v > 0.0 else 0.0
        out[i, col] = v


@njit(cache=True, nogil=True)
def hex_column(
    offsets: np.ndarray, data: np.ndarray, feature: int, out: np.ndarray, err: np.ndarray, code: int
) -> None:
    """One hex id per row: ``(feature << 33) | value``, empty -> the feature's missing id."""
    base = np.int64(feature) << HEX_FEATURE_SHIFT
    for i in range(out.shape[0]):
        v, st = parse_hex(data, offsets[i], offsets[i + 1])
        if st == BAD:
            if err[i] == 0:
                err[i] = code
            out[i] = base | HEX_MISSING
        elif st == MISSING:
            out[i] = base | HEX_MISSING
        else:
            out[i] = base | v


@njit(cache=True, nogil=True)
def hash_column(offsets: np.ndarray, data: np.ndarray, state: np.uint64, missing_id: int, out: np.ndarray) -> None:
    """One hashed id per row; an empty value gets ``missing_id``."""
    for i in range(out.shape[0]):
        s, e = offsets[i], offsets[i + 1]
        out[i] = missing_id if s == e else finish_hash(fnv1a(state, data, s, e))


@njit(cache=True, nogil=True)
def _find(data: np.ndarray, sep: np.ndarray, k: int, e: int) -> int:
    """Position of the next separator at or after ``k`` (``e`` if none)."""
    m = sep.shape[0]
    while k + m <= e:
        j = 0
        while j < m and data[k + j] == sep[j]:
            j += 1
        if j == m:
            return k
        k += 1
    return e


@njit(cache=True, nogil=True)
def multi_column(
    offsets: np.ndarray,
    data: np.ndarray,
    sep: np.ndarray,
    hex_mode: bool,
    feature: int,
    state: np.uint64,
    lengths: np.ndarray,
    err: np.ndarray,
    code: int,
) -> np.ndarray:
    """Split each value on ``sep`` (empty pieces dropped) and id every piece.

    Writes ``lengths`` [n] and returns the ids [sum(lengths)] int64. An empty
    value is an empty bag.
    """
    n = lengths.shape[0]
    m = sep.shape[0]
    total = 0
    for i in range(n):
        s, e = offsets[i], offsets[i + 1]
        cnt = 0
        k = s
        while k < e:
            j = _find(data, sep, k, e)
            if j > k:
                cnt += 1
            k = j + m
        lengths[i] = cnt
        total += cnt
    out = np.empty(total, np.int64)
    base = np.int64(feature) << HEX_FEATURE_SHIFT
    p = 0
    for i in range(n):
        s, e = offsets[i], offsets[i + 1]
        k = s
        while k < e:
            j = _find(data, sep, k, e)
            if j > k:
                if hex_mode:
                    v, st = parse_hex(data, k, j)
                    if st != OK and err[i] == 0:
                        err[i] = code
                    out[p] = base | v
                else:
                    out[p] = finish_hash(fnv1a(state, data, k, j))
                p += 1
            k = j + m
    return out


@njit(cache=True, nogil=True)
def hash_int_column(values: np.ndarray, valid: np.ndarray, state: np.uint64, missing_id: int, out: np.ndarray) -> None:
    """Hash integers as their decimal text (so CSV "42" and Parquet 42 agree)."""
    buf = np.empty(24, np.uint8)
    for i in range(values.shape[0]):
        if not valid[i]:
            out[i] = missing_id
            continue
        x = np.int64(values[i])
        neg = x < 0
        p = 24
        # digits of |x| from the right; negate digit-wise so INT64_MIN works
        while True:
            d = x % 10
            if neg and d > 0:
                d = 10 - d
            p -= 1
            buf[p] = 48 + d
            x = (x - (-d if neg else d)) // 10
            if x == 0:
                break
        if neg:
            p -= 1
            buf[p] = 45
        out[i] = finish_hash(fnv1a(state, buf, p, 24))


@njit(cache=True, nogil=True)
def hex_int_column(values: np.ndarray, valid: np.ndarray, feature: int, out: np.ndarray, err: np.ndarray, code: int) -> None:
    """Integers already holding the 32-bit value of a hex-scheme feature."""
    base = np.int64(feature) << HEX_FEATURE_SHIFT
    for i in range(values.shape[0]):
        v = np.int64(values[i])
        if not valid[i]:
            out[i] = base | HEX_MISSING
        elif v < 0 or v >= HEX_MISSING:
            if err[i] == 0:
                err[i] = code
            out[i] = base | HEX_MISSING
        else:
            out[i] = base | v
