"""A served table: an export's table file, looked up by raw id, memory-mapped by default.

Ids are found by a batched binary search in the table's ascending ids
(tierec/store/sorted_search.py; fp32 rows: one compiled pass that searches and
copies, numba; else the positions, then numpy); only the rows a
request needs are read, so a table larger than RAM can be served (the OS pages
rows in and out). An id the table does not hold reads as zeros: what training
gives an id never seen when it evaluates (tables in eval mode return zeros for
unknown ids and insert nothing; tierec/train/evaluate.py), so the scores match
``tierec predict``'s. Rows come back as float32 whatever the export's precision.

>>> import tempfile, os, numpy as np
>>> from tierec.serving.manifest import TableEntry
>>> from tierec.serving.rows import RowChunk
>>> from tierec.serving.table_file import TableFileWriter, TableShape
>>> d = tempfile.mkdtemp()
>>> shape = TableShape(table="t", dim=2, layout="ragged", precision="fp32", rows=2, values=3)
>>> w = TableFileWriter(os.path.join(d, "t.safetensors"), shape)
>>> w.append(RowChunk(np.array([3, 8]), np.array([2, 1]), np.array([1, 2, 5], np.float32))); w.close()
>>> t = ServedTable.open(d, TableEntry(name="t", file="t.safetensors", dim=2, layout="ragged", rows=2))
>>> t.lookup(np.array([8, 4, 3])).tolist()
[[5.0, 0.0], [0.0, 0.0], [1.0, 2.0]]
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from numba import njit

from tierec.paths import safe_member
from tierec.serving.manifest import ExportError, TableEntry
from tierec.serving.rows import decode, starts_of
from tierec.serving.table_file import TableFile
from tierec.store.sorted_search import find_sorted, lower_bounds


class ServedTable:
    def __init__(self, entry: TableEntry, file: TableFile) -> None:
        self.entry = entry
        self.dim = entry.dim
        self.ids = file.ids  # [n] int64 ascending
        self.rows = file.array("rows")  # [n, dim] (whole layout)
        self.offsets = file.array("offsets")  # [n + 1] (ragged layout)
        self.values = file.array("values")  # [total] (ragged layout)
        self.scale = file.array("scale")  # [n] float32 (int8)
        self.bias = file.array("bias")
        expected = "offsets" if entry.layout == "ragged" else "rows"
        if file.array(expected) is None or self.ids.shape[0] != entry.rows:
            raise ExportError(f"table file {entry.file} does not match the manifest (layout {entry.layout}, {entry.rows} rows)")
        self.compiled = self.rows is not None and self.rows.dtype == np.float32 and self.scale is None
        if self.compiled:  # compiled (or loaded from numba's cache) now, not in the first request
            _lookup_fp32(self.ids, self.rows, np.empty(0, np.int64), np.empty((0, self.dim), np.float32))

    @staticmethod
    def open(directory: str | os.PathLike, entry: TableEntry, mmap: bool = True) -> ServedTable:
        path = Path(directory) / safe_member(entry.file, f"{directory}/manifest.json")
        return ServedTable(entry, TableFile.open(path, mmap=mmap))

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found [N] bool, position [N] int64 where found) of raw ``ids``."""
        return find_sorted(self.ids, ids)  # numpy's searchsorted: 7-12x the time for 20k ids at random

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Rows [N, dim] float32 of raw ``ids`` [N] int64; zeros for ids the table does not hold."""
        if self.compiled:  # fp32 rows: one compiled pass
            out = np.empty((ids.shape[0], self.dim), np.float32)
            _lookup_fp32(self.ids, self.rows, ids, out)
            return out
        found, pos = self.find(ids)
        if self.rows is not None and self.ids.shape[0]:  # every id's row at its position, then zeros where not found
            out = self.rows.take(pos, axis=0).astype(np.float32, copy=False)  # [N, dim], a copy
            if self.scale is not None and self.bias is not None:
                out *= self.scale.take(pos)[:, None]
                out += self.bias.take(pos)[:, None]
            if not found.all():
                out[~found] = 0.0
            return out
        out = np.zeros((ids.shape[0], self.dim), np.float32)
        p = pos[found]
        if not p.size:
            return out
        scale = None if self.scale is None else np.asarray(self.scale[p])
        bias = None if self.bias is None else np.asarray(self.bias[p])
        start = np.asarray(self.offsets[p])
        lens = np.asarray(self.offsets[p + 1]) - start
        flat = np.asarray(self.values[_spans(start, lens)])
        block = np.zeros((p.shape[0], self.dim), np.float32)
        block[np.arange(self.dim) < lens[:, None]] = decode(flat, scale, bias, lens)
        out[found] = block
        return out


def _spans(start: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Positions ``start[i] .. start[i] + lens[i] - 1`` of every row, row after row."""
    total = int(lens.sum())
    return np.repeat(start - starts_of(lens), lens) + np.arange(total, dtype=np.int64)


@njit(cache=True, nogil=True)
def _lookup_fp32(table_ids: np.ndarray, rows: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
    """``out[i]`` = the row of ``ids[i]`` in the ascending ``table_ids``, zeros when absent. The positions come from
    a batched branch-free binary search (16 ids stepped together, so a level's reads overlap): 2,000 / 20,000 ids at
    random in 10M table ids, dim 16, 0.21 / 2.0 ms against 0.70 / 8.0 ms searching one id at a time."""
    n = table_ids.shape[0]
    pos = np.empty(ids.shape[0], np.int64)
    lower_bounds(table_ids, ids, pos)
    for i in range(ids.shape[0]):
        p = pos[i]
        if p < n and table_ids[p] == ids[i]:
            out[i, :] = rows[p, :]
        else:
            out[i, :] = 0.0
