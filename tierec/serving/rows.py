"""Rows of a table as an export stores them: ragged chunks, their precision, and reading them back.

A chunk of rows is ``ids`` [m] int64, ``lens`` [m] int64 (each row's dims: the
table's dim, or fewer for a pruned row) and ``values`` [sum(lens)], rows one
after another. :func:`encode` turns float32 values into the export's precision:
``fp32``, ``fp16``, or ``int8`` row-wise (FBGEMM's fused 8-bit row-wise form:
uint8 codes with a float32 ``scale`` and ``bias`` per row, ``x ~ code * scale + bias``,
the row's min as bias and (max - min) / 255 as scale). :func:`decode` is the inverse.

>>> import numpy as np
>>> c = RowChunk(np.array([9, 4]), np.array([2, 1]), np.array([0.5, -1.0, 2.0], np.float32))
>>> e = encode(c, "int8")
>>> e.values.dtype, np.allclose(decode(e.values, e.scale, e.bias, e.lens), c.values, atol=1.5 / 255)
(dtype('uint8'), True)
>>> s = c.take(np.argsort(c.ids))
>>> s.ids.tolist(), s.values.tolist()
([4, 9], [2.0, 0.5, -1.0])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

VALUE_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int8": np.uint8}


@dataclass(frozen=True)
class RowChunk:
    ids: np.ndarray  # [m] int64
    lens: np.ndarray  # [m] int64, dims of each row
    values: np.ndarray  # [sum(lens)] in the export's value dtype
    scale: np.ndarray | None = None  # [m] float32 (int8 only)
    bias: np.ndarray | None = None  # [m] float32 (int8 only)

    @property
    def size(self) -> int:
        return int(self.ids.shape[0])

    def take(self, order: np.ndarray) -> RowChunk:
        """The rows at ``order`` (indices), in that order."""
        return RowChunk(
            self.ids[order],
            self.lens[order],
            self.values[ragged_index(self.lens, order)],
            None if self.scale is None else self.scale[order],
            None if self.bias is None else self.bias[order],
        )

    def head(self, k: int) -> tuple[RowChunk, RowChunk]:
        """The first ``k`` rows and the rest."""
        cut = int(self.lens[:k].sum())

        def part(a, s):
            return None if a is None else a[s]

        first = slice(0, k)
        rest = slice(k, None)
        return (
            RowChunk(self.ids[first], self.lens[first], self.values[:cut], part(self.scale, first), part(self.bias, first)),
            RowChunk(self.ids[rest], self.lens[rest], self.values[cut:], part(self.scale, rest), part(self.bias, rest)),
        )

    @staticmethod
    def concat(chunks: list[RowChunk]) -> RowChunk:
        def cat(name):
            parts = [getattr(c, name) for c in chunks]
            return None if parts[0] is None else np.concatenate(parts)

        return RowChunk(cat("ids"), cat("lens"), cat("values"), cat("scale"), cat("bias"))


def starts_of(lens: np.ndarray) -> np.ndarray:
    """[m] int64 start of each row in the flat values."""
    out = np.zeros(lens.shape[0], np.int64)
    if lens.shape[0] > 1:
        np.cumsum(lens[:-1], out=out[1:])
    return out


def ragged_index(lens: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Positions in the flat values of the rows ``order``, row after row."""
    starts = starts_of(lens)[order]
    picked = lens[order]
    total = int(picked.sum())
    base = np.repeat(starts - starts_of(picked), picked)
    return base + np.arange(total, dtype=np.int64)


def encode(chunk: RowChunk, precision: str) -> RowChunk:
    """``chunk`` (float32 values) in ``precision``."""
    if precision == "fp32":
        return chunk
    if precision == "fp16":
        return RowChunk(chunk.ids, chunk.lens, chunk.values.astype(np.float16))
    if precision != "int8":
        raise ValueError(f"precision must be one of {sorted(VALUE_DTYPES)}, got {precision!r}")
    lo, hi = row_min_max(chunk.values, chunk.lens)
    scale = ((hi - lo) / np.float32(255.0)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1.0))
    per_value = np.repeat(np.arange(chunk.size), chunk.lens)
    codes = np.rint((chunk.values - lo[per_value]) / safe[per_value])
    return RowChunk(chunk.ids, chunk.lens, np.clip(codes, 0, 255).astype(np.uint8), scale, lo.astype(np.float32))


def decode(values: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None, lens: np.ndarray) -> np.ndarray:
    """float32 values of rows stored as ``values`` (flat, rows of ``lens`` one after another)."""
    if scale is None or bias is None:
        return values.astype(np.float32, copy=False)
    per_value = np.repeat(np.arange(lens.shape[0]), lens)
    return values.astype(np.float32) * scale[per_value] + bias[per_value]


def row_min_max(values: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[m] float32 min and max of each row (0 for a row of no dims)."""
    m = lens.shape[0]
    lo = np.zeros(m, np.float32)
    hi = np.zeros(m, np.float32)
    full = np.flatnonzero(lens > 0)
    if full.size:
        starts = starts_of(lens)[full]
        lo[full] = np.minimum.reduceat(values, starts)
        hi[full] = np.maximum.reduceat(values, starts)
    return lo, hi
