"""Sorting a table's rows by id with bounded memory: sorted runs on disk, then a k-way merge.

A checkpoint holds a table as chunk files in row order (tierec/train/checkpoint.py),
each about 16 MiB. An export wants the whole table in id order. Each chunk is
sorted on its own and written to a run file (:class:`RunWriter`); the runs are
then merged (:func:`merge_runs`) reading a block of each at a time: every
round takes, from every run, the rows whose id is at most the smallest "last
id read" among the runs not yet read to their end (no row still unread can
come before those), sorts what it took and hands it on. So RAM holds one
checkpoint chunk while the runs are written, then about ``budget`` bytes of
blocks while they merge, whatever the table's size; the runs need as much
temporary disk as the table's exported rows.

>>> import tempfile, numpy as np
>>> from tierec.serving.rows import RowChunk
>>> w = RunWriter(tempfile.mkdtemp())
>>> w.add(RowChunk(np.array([5, 1]), np.array([1, 1]), np.array([50, 10], np.float32)))
>>> w.add(RowChunk(np.array([3, 9]), np.array([1, 1]), np.array([30, 90], np.float32)))
>>> out = RowChunk.concat(list(merge_runs(w.runs, np.float32, budget=64)))
>>> out.ids.tolist(), out.values.tolist()
([1, 3, 5, 9], [10.0, 30.0, 50.0, 90.0])
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tierec.serving.manifest import ExportError
from tierec.serving.rows import RowChunk

MERGE_BUDGET = 1 << 26  # bytes of run blocks a merge holds at once (64 MiB)


@dataclass(frozen=True)
class Run:
    """A sorted run: its file and where each array starts in it (rows, values and their dtype)."""

    path: Path
    rows: int
    values: int
    quantized: bool  # has scale and bias

    def offsets(self, itemsize: int) -> dict[str, int]:
        """Byte offset of each array: ids, lens, values, scale, bias."""
        at, out = 0, {}
        for name, size in (("ids", 8 * self.rows), ("lens", 8 * self.rows), ("values", itemsize * self.values),
                           ("scale", 4 * self.rows), ("bias", 4 * self.rows)):  # fmt: skip
            out[name] = at
            at += size
        return out


class RunWriter:
    """Sorts each chunk it is given by id and writes it as a run file in ``directory``."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.runs: list[Run] = []

    def add(self, chunk: RowChunk) -> None:
        if not chunk.size:
            return
        chunk = chunk.take(np.argsort(chunk.ids, kind="stable"))
        path = self.directory / f"run-{len(self.runs):06d}.bin"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                for a in (chunk.ids.astype(np.int64), chunk.lens.astype(np.int64), chunk.values, chunk.scale, chunk.bias):
                    if a is not None:
                        f.write(np.ascontiguousarray(a).tobytes())
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        self.runs.append(Run(path, chunk.size, int(chunk.lens.sum()), chunk.scale is not None))

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.runs)

    @property
    def values(self) -> int:
        return sum(r.values for r in self.runs)


class _Cursor:
    """Reads one run a block of rows at a time (plain reads, no mapping: RAM stays what is read)."""

    def __init__(self, run: Run, dtype: np.dtype, block_rows: int) -> None:
        self.run, self.dtype, self.block_rows = run, np.dtype(dtype), block_rows
        self.at = self.run.offsets(self.dtype.itemsize)
        self.next_row = 0
        self.next_value = 0
        self.buffer: RowChunk | None = None

    @property
    def exhausted(self) -> bool:  # every row was read into the buffer
        return self.next_row >= self.run.rows

    def fill(self) -> None:
        if self.exhausted or (self.buffer is not None and self.buffer.size):
            return
        a, n = self.next_row, min(self.block_rows, self.run.rows - self.next_row)
        p = str(self.run.path)
        ids = np.fromfile(p, np.int64, n, offset=self.at["ids"] + 8 * a)
        lens = np.fromfile(p, np.int64, n, offset=self.at["lens"] + 8 * a)
        total = int(lens.sum())
        values = np.fromfile(p, self.dtype, total, offset=self.at["values"] + self.dtype.itemsize * self.next_value)
        scale = bias = None
        if self.run.quantized:
            scale = np.fromfile(p, np.float32, n, offset=self.at["scale"] + 4 * a)
            bias = np.fromfile(p, np.float32, n, offset=self.at["bias"] + 4 * a)
        self.buffer = RowChunk(ids, lens, values, scale, bias)
        self.next_row += n
        self.next_value += total

    def take_upto(self, cutoff: int | None) -> RowChunk | None:
        """Remove and return the buffered rows with ids <= ``cutoff`` (all of them when None)."""
        if self.buffer is None or not self.buffer.size:
            return None
        k = self.buffer.size if cutoff is None else int(np.searchsorted(self.buffer.ids, cutoff, side="right"))
        taken, self.buffer = self.buffer.head(k)
        return taken if k else None


def merge_runs(runs: list[Run], dtype: np.dtype | type, budget: int = MERGE_BUDGET, dim: int = 1) -> Iterator[RowChunk]:
    """The rows of all ``runs`` in ascending id order, a bounded block at a time; a repeated id is an ExportError."""
    if not runs:
        return
    row_bytes = 16 + 8 + np.dtype(dtype).itemsize * max(dim, 1)
    block_rows = max(16, budget // (len(runs) * row_bytes))
    cursors = [_Cursor(r, np.dtype(dtype), block_rows) for r in runs]
    last_id: int | None = None
    while True:
        for c in cursors:
            c.fill()
        live = [c for c in cursors if c.buffer is not None and c.buffer.size]
        if not live:
            return
        pending = [int(c.buffer.ids[-1]) for c in live if not c.exhausted]  # type: ignore[union-attr]
        cutoff = min(pending) if pending else None
        parts = [p for c in live if (p := c.take_upto(cutoff)) is not None]
        merged = RowChunk.concat(parts)
        merged = merged.take(np.argsort(merged.ids, kind="stable"))
        ids = merged.ids
        if ids.size > 1 and bool((ids[1:] == ids[:-1]).any()) or (last_id is not None and ids.size and ids[0] <= last_id):
            raise ExportError("a table of the checkpoint holds an id twice; the checkpoint is damaged")
        if ids.size:
            last_id = int(ids[-1])
            yield merged
