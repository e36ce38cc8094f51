"""Splits by a column (``data.split = "column"``): the rows with the largest values are the test split.

One streaming pass over the column (:func:`column_cutoffs`) keeps a seeded
reservoir of up to :data:`SAMPLE_VALUES` values and takes two cutoffs from it:
rows whose value is at least ``t_test`` are test, from ``t_val`` up to ``t_test``
validation, the rest (and rows whose value is missing or not a number) train.
Equal values are always in the same split, so a split may be a little larger
than asked when the cutoff falls on many equal values (a day's timestamp). Below
:data:`SAMPLE_VALUES` rows the cutoffs and row counts are exact; above, they are
estimates from the sample (``num_rows`` of such a split is then an estimate).

>>> import numpy as np
>>> from tierec.data.blocks import RowBlock
>>> t_val, t_test, counts = cutoffs_of(np.array([5.0, 1, 2, 2, 3, 4, np.nan, 9, 8, 7]), 0.2, 0.2)
>>> (t_val, t_test), counts
((5.0, 8.0), {'train': 6, 'validation': 2, 'test': 2})
>>> blk = RowBlock.from_ids(np.zeros(3, np.float32), np.zeros((3, 0), np.float32), np.zeros((0, 3), np.int64))
>>> ColumnSplit(8.0, np.inf).keep(blk.with_order(np.array([9.0, 1.0, 8.0]))).tolist()
[True, False, True]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tierec.data.blocks import RowBlock
from tierec.data.columns import number_values
from tierec.data.errors import DataError

if TYPE_CHECKING:
    from tierec.data.reader import Reader

SAMPLE_VALUES = 1 << 20  # values kept for the quantiles; exact below this many rows
_SEED = 0x5B117


@dataclass(frozen=True)
class ColumnSplit:
    """Rows whose split-column value is in ``[lo, hi)``; missing values belong to the lowest range (train)."""

    lo: float
    hi: float

    def keep(self, block: RowBlock) -> np.ndarray:
        """[n] bool: the block's rows that belong to the split."""
        if block.order is None:
            raise ValueError("a column split needs the split column's values of the block")
        v = block.order
        inside = (v >= self.lo) & (v < self.hi)
        return inside | np.isnan(v) if self.lo == -np.inf else inside


def column_cutoffs(reader: Reader, column: str, test: float, validation: float) -> tuple[float, float, dict[str, int]]:
    """``(t_val, t_test, rows per split)`` from one pass over ``column`` of ``reader``'s file."""
    rng = np.random.default_rng(_SEED)
    kept = np.empty(0, np.float64)
    seen, missing = 0, 0
    for _, values in reader.column(column):
        v = number_values(values)
        nan = np.isnan(v)
        missing += int(nan.sum())
        v = v[~nan]
        if seen + v.size <= SAMPLE_VALUES:
            kept = np.concatenate([kept, v])
        else:  # reservoir sampling, a block at a time: value i (0-based over all values) replaces slot j < SAMPLE_VALUES
            if kept.size < SAMPLE_VALUES:
                room = SAMPLE_VALUES - kept.size
                kept, v, seen = np.concatenate([kept, v[:room]]), v[room:], seen + room
            j = (rng.random(v.size) * (seen + 1 + np.arange(v.size))).astype(np.int64)
            take = j < SAMPLE_VALUES
            kept[j[take]] = v[take]  # (a later value taking the same slot wins, as in the sequential algorithm)
        seen += v.size
    if seen == 0:
        raise DataError(f"{reader.display}: data.split_column {column!r} holds no numbers; a column split needs numbers or times")
    t_val, t_test, counts = cutoffs_of(kept, test, validation)
    scale = seen / kept.size  # 1 when every value was kept
    counts = {k: int(round(c * scale)) for k, c in counts.items()}
    counts["train"] += missing
    if counts["train"] == 0:
        raise DataError(f"{reader.display}: data.split_column {column!r}: the test and validation rows take every value; no training rows are left")
    return t_val, t_test, counts


def cutoffs_of(values: np.ndarray, test: float, validation: float) -> tuple[float, float, dict[str, int]]:
    """Cutoffs for the fractions ``test`` and ``validation`` of ``values`` [m] (NaN: missing, counted in train)."""
    nan = int(np.isnan(values).sum())
    s = np.sort(values[~np.isnan(values)])
    m = s.size

    def cut(fraction: float) -> float:
        k = m - int(round(fraction * m))
        return float(s[k]) if k < m else np.inf

    t_test = cut(test)
    t_val = min(cut(test + validation), t_test)
    below_val = int(np.searchsorted(s, t_val, side="left"))
    below_test = int(np.searchsorted(s, t_test, side="left"))
    return t_val, t_test, {"train": below_val + nan, "validation": below_test - below_val, "test": m - below_test}
