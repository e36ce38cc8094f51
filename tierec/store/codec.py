"""RowCodec: how a row record is stored in the cold tiers (host DRAM, disk): fp32, bf16 or int8.

A record is ``[weights (dim) | optimizer state]`` float32. The fast tier and
all arithmetic keep it so; a row leaving the fast tier is encoded into
``words`` 4-byte words (what :class:`~tierec.store.host.HostTier` and
:class:`~tierec.store.disk.DiskTier` hold), and decoded to float32 when it
comes back up or is read (checkpoints stay float32).

- ``fp32``: the record itself (no copy; bitwise what the tiers held before codecs).
- ``bf16``: every value as bfloat16, except optimizer state of one float per
  row (row-wise Adagrad's sum), which stays float32: after padding to whole
  words it costs nothing.
- ``int8``: the weights as one byte each on a row-wise grid ``bias + q * 2**k``
  (``bias`` and ``2**k`` float32 in the record); optimizer state as in bf16
  (Adam's moments and Adagrad's sums bf16, row-wise state float32).

Rounding is stochastic and unbiased (the expected decoded value is the
encoded one), so small updates to cold rows are not lost on average. The
random bits are a hash of (table, id, seed, the store's lookup clock): a run
is reproducible and a resumed run draws the same bits. Encoding is
idempotent (a decoded row encodes to the same values, whatever the bits): the
int8 grid step is a power of two with the bias on the grid (the finest such
grid on which the row spans at most 255 steps), so a decoded row gets a grid
no coarser than its own and has nothing to round; nor has a bf16 value. So a row read
back into a checkpoint and stored again is unchanged, and a resumed run is exact.

>>> import numpy as np
>>> from tierec.config import ColdPrecision
>>> from tierec.store.codec import row_codec
>>> c = row_codec(ColdPrecision.INT8, dim=16, state_widths=[1], seed=0)
>>> c.words, 17 * 4 // (4 * c.words)  # 7 words instead of 17: 2.4x the rows per byte
(7, 2)
>>> rec = np.random.default_rng(0).standard_normal((3, 17)).astype(np.float32)
>>> keys, tabs = np.arange(3), np.zeros(3, dtype=np.int32)
>>> back = c.decode(c.encode(rec, keys, tabs, step=1))
>>> bool(np.abs(back - rec)[:, :16].max() < 0.05), bool((back[:, 16] == rec[:, 16]).all())
(True, True)
>>> bool((c.decode(c.encode(back, keys, tabs, step=2)) == back).all())  # idempotent
True
"""

from __future__ import annotations

import math
from typing import Protocol

import numba as nb
import numpy as np

from tierec.config import ColdPrecision
from tierec.embedding.kernels import key_hash, mix64

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_LEVELS = 255  # grid steps an int8 row may span
_MIN_EXP = -126  # the grid step 2**k stays a normal float32


class RowCodec(Protocol):
    """Encodes float32 records [n, W] into [n, words] 4-byte words (float32-typed) and back."""

    precision: ColdPrecision
    width: int  # float32 per decoded record (W)
    words: int  # 4-byte words per encoded record
    lossy: bool  # whether a record changes on the way through (then placement matters: see TierRecords, state.py)

    def encode(self, records: np.ndarray, keys: np.ndarray, tabs: np.ndarray, step: int) -> np.ndarray: ...

    def decode(self, words: np.ndarray) -> np.ndarray: ...


class Fp32Codec:
    """The record as it is: no copy, no change."""

    precision = ColdPrecision.FP32
    lossy = False

    def __init__(self, width: int) -> None:
        self.width = self.words = width

    def encode(self, records: np.ndarray, keys: np.ndarray, tabs: np.ndarray, step: int) -> np.ndarray:
        return records

    def decode(self, words: np.ndarray) -> np.ndarray:
        return words


@nb.njit(cache=True, nogil=True)
def _encode(bits, vals, keys, tabs, seed, step, f_cols, h_cols, q_cols, out_f, out_h, out_q):
    """Per row: float32 columns copied, bf16 columns rounded stochastically, int8 columns on a grid.

    ``bits`` is ``vals`` as uint32. ``out_f`` [n, len(f_cols) (+ 2: bias, step of the int8 grid)].
    """
    n_f = f_cols.shape[0]
    salt = mix64(np.uint64(seed) * _GOLDEN + np.uint64(step))
    for i in range(vals.shape[0]):
        h = mix64(key_hash(np.int32(tabs[i]), keys[i]) ^ salt)
        for c in range(n_f):
            out_f[i, c] = vals[i, f_cols[c]]
        for c in range(h_cols.shape[0]):
            b = np.uint64(bits[i, h_cols[c]])
            if (b & np.uint64(0x7F800000)) == np.uint64(0x7F800000):  # inf / nan: truncate, keep a nan a nan
                out_h[i, c] = np.uint16((b >> np.uint64(16)) | np.uint64(0x40 if b & np.uint64(0x7FFFFF) else 0))
            else:  # adding 16 random bits before truncating rounds the magnitude up with probability = its fraction
                r = mix64(h + np.uint64(c + 1) * _GOLDEN) & np.uint64(0xFFFF)
                out_h[i, c] = np.uint16((b + r) >> np.uint64(16))
        n_q = q_cols.shape[0]
        if n_q == 0:
            continue
        lo = np.float64(vals[i, q_cols[0]])
        hi = lo
        for c in range(1, n_q):
            x = np.float64(vals[i, q_cols[c]])
            lo = min(lo, x)
            hi = max(hi, x)
        span = hi - lo
        if not (span > 0.0 and math.isfinite(span)):  # a constant row (or a broken one): exact as its bias
            out_f[i, n_f] = np.float32(lo)
            out_f[i, n_f + 1] = np.float32(0.0)
            for c in range(n_q):
                out_q[i, c] = 0
            continue
        # The finest grid 2**k whose steps from floor(lo) to ceil(hi) fit in a byte. A decoded row lies on
        # its grid within 255 steps, so it gets the same grid or a finer one and encodes to itself.
        # (x * 2**-k is x / 2**k exactly: a power of two, and float32 values stay normal float64 either way)
        k = max(math.ceil(math.log2(span / _LEVELS)), _MIN_EXP)
        while math.ceil(hi * math.ldexp(1.0, -k)) - math.floor(lo * math.ldexp(1.0, -k)) > _LEVELS:
            k += 1
        scale = math.ldexp(1.0, k)
        inv = math.ldexp(1.0, -k)
        bias = math.floor(lo * inv) * scale
        out_f[i, n_f] = np.float32(bias)
        out_f[i, n_f + 1] = np.float32(scale)
        for c in range(n_q):
            t = (np.float64(vals[i, q_cols[c]]) - bias) * inv
            u = np.float64(mix64(h + np.uint64(c + 1 + 65536) * _GOLDEN) >> np.uint64(40)) * (1.0 / 16777216.0)
            q = math.floor(t + u)
            out_q[i, c] = np.uint8(min(max(q, 0), 255))


@nb.njit(cache=True, nogil=True)
def _decode(f, hv, qv, f_cols, h_cols, q_cols, out):
    n_f = f_cols.shape[0]
    for i in range(out.shape[0]):
        for c in range(n_f):
            out[i, f_cols[c]] = f[i, c]
        for c in range(h_cols.shape[0]):
            out[i, h_cols[c]] = hv[i, c]
        if q_cols.shape[0]:
            bias = np.float64(f[i, n_f])
            scale = np.float64(f[i, n_f + 1])
            for c in range(q_cols.shape[0]):
                out[i, q_cols[c]] = np.float32(bias + np.float64(qv[i, c]) * scale)  # exact: on the grid


class PackedCodec:
    """bf16 / int8: a record packed as ``[float32 columns (+ int8 bias, step) | bf16 columns | int8 bytes | pad]``."""

    lossy = True

    def __init__(self, precision: ColdPrecision, width: int, f_cols, h_cols, q_cols, seed: int) -> None:
        self.precision = precision
        self.width = width
        self.seed = seed
        self.f_cols, self.h_cols, self.q_cols = (np.asarray(c, dtype=np.int64) for c in (f_cols, h_cols, q_cols))
        self.n_f = self.f_cols.size + (2 if self.q_cols.size else 0)  # float32 fields
        self._h0 = 4 * self.n_f  # byte offsets of the parts
        self._q0 = self._h0 + 2 * self.h_cols.size
        self.words = -(-(self._q0 + self.q_cols.size) // 4)

    def encode(self, records: np.ndarray, keys: np.ndarray, tabs: np.ndarray, step: int) -> np.ndarray:
        n = records.shape[0]
        vals = np.ascontiguousarray(records, dtype=np.float32)
        out = np.zeros((n, 4 * self.words), dtype=np.uint8)  # [n, bytes]; the pad stays zero
        f = np.empty((n, self.n_f), dtype=np.float32)
        h = np.empty((n, self.h_cols.size), dtype=np.uint16)
        q = np.empty((n, self.q_cols.size), dtype=np.uint8)
        _encode(vals.view(np.uint32), vals, np.asarray(keys, dtype=np.int64), np.asarray(tabs, dtype=np.int32),
                self.seed, step, self.f_cols, self.h_cols, self.q_cols, f, h, q)
        out[:, : self._h0] = f.view(np.uint8)
        out[:, self._h0 : self._q0] = h.view(np.uint8)
        out[:, self._q0 : self._q0 + q.shape[1]] = q
        return out.view(np.float32)  # [n, words]

    def decode(self, words: np.ndarray) -> np.ndarray:
        b = np.ascontiguousarray(words, dtype=np.float32).view(np.uint8)  # [n, bytes]
        n = b.shape[0]
        f = np.ascontiguousarray(b[:, : self._h0]).view(np.float32)
        hv = (np.ascontiguousarray(b[:, self._h0 : self._q0]).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        qv = np.ascontiguousarray(b[:, self._q0 : self._q0 + self.q_cols.size])
        out = np.empty((n, self.width), dtype=np.float32)
        _decode(f.reshape(n, self.n_f), hv.reshape(n, self.h_cols.size), qv, self.f_cols, self.h_cols, self.q_cols, out)
        return out


def row_codec(precision: ColdPrecision | str, dim: int, state_widths: list[int], seed: int) -> RowCodec:
    """The codec of records ``[weights (dim) | state of each width in turn]`` for ``precision``.

    ``precision`` is the most it may round: a layout that saves no word over the next finer one
    gives way to it (int8 weights carry 8 bytes of bias and step, so below about 12 dims int8 is
    bf16; a record of one float stays fp32). ``codec.precision`` says which was chosen.
    """
    precision = ColdPrecision.parse(precision)
    width = dim + sum(state_widths)
    f_cols, h_cols, col = [], [], dim
    for w in state_widths:  # row-wise state (one float) stays float32; per-dim state goes bf16
        (f_cols if w == 1 else h_cols).extend(range(col, col + w))
        col += w
    weights = list(range(dim))
    best: RowCodec = Fp32Codec(width)
    if precision is ColdPrecision.FP32:
        return best
    bf16 = PackedCodec(ColdPrecision.BF16, width, f_cols, weights + h_cols, [], seed)
    best = bf16 if bf16.words < best.words else best
    if precision is ColdPrecision.INT8:
        int8 = PackedCodec(ColdPrecision.INT8, width, f_cols, h_cols, weights, seed)
        best = int8 if int8.words < best.words else best
    return best
