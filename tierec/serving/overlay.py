"""A served table with the rows published since its export laid over it (``tierec serve --follow``).

An export's table file is never rewritten: the rows that delta checkpoints
changed since then (inserted or updated) are kept in RAM, at the export's
precision, in an :class:`Overlay` together with the ids they deleted. A
:class:`PatchedTable` looks an id up in the overlay first (a changed row), then
among the deleted ids (zeros, as for an id the table never held), then in the
table file. :meth:`PatchedTable.patched` returns a new table with one more
delta merged in; the old one is left as it was, so a request being scored with
it sees either the whole delta or none of it. The overlay holds every row
changed since the export (or since the full checkpoint the server last took
up): at most the table's rows, in RAM.

>>> import numpy as np
>>> from tierec.serving.manifest import TableEntry
>>> from tierec.serving.rows import RowChunk
>>> base = in_memory(TableEntry(name="t", file="", dim=2, layout="whole", rows=0),
...                  RowChunk(np.array([3, 8]), np.array([2, 2]), np.array([1, 2, 5, 6], np.float32)))
>>> t = PatchedTable(base, Overlay.empty(2))
>>> t2 = t.patched(RowChunk(np.array([4]), np.array([2]), np.array([7, 7], np.float32)), np.array([8]), "fp32")
>>> t2.lookup(np.array([3, 4, 8])).tolist(), t.lookup(np.array([3, 4, 8])).tolist()
([[1.0, 2.0], [7.0, 7.0], [0.0, 0.0]], [[1.0, 2.0], [0.0, 0.0], [5.0, 6.0]])
>>> t2.overlay.size, t2.overlay.deleted.tolist()
(1, [8])
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tierec.serving.manifest import TableEntry
from tierec.serving.rows import RowChunk, encode
from tierec.serving.table_file import TableFile
from tierec.serving.tables import ServedTable
from tierec.store.sorted_search import find_sorted


def in_memory(entry: TableEntry, chunk: RowChunk) -> ServedTable:
    """A served table over ``chunk`` (ids ascending, any precision): whole rows of ``entry.dim``, or pruned rows
    at their own dims (the ragged layout, as the export stores a pruned table)."""
    if (chunk.lens == entry.dim).all():
        arrays, layout = {"ids": chunk.ids, "rows": chunk.values.reshape(chunk.size, entry.dim)}, "whole"
    else:
        offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(chunk.lens, dtype=np.int64)])
        arrays, layout = {"ids": chunk.ids, "offsets": offsets, "values": chunk.values}, "ragged"
    if chunk.scale is not None and chunk.bias is not None:
        arrays.update(scale=chunk.scale, bias=chunk.bias)
    return ServedTable(replace(entry, layout=layout, rows=chunk.size), TableFile(arrays, {}))


@dataclass(frozen=True)
class Overlay:
    """Rows changed since the export (``changed``: ids ascending, export precision) and ids deleted (ascending)."""

    changed: RowChunk
    deleted: np.ndarray  # [m] int64

    @staticmethod
    def empty(dim: int) -> Overlay:
        none = np.empty(0, np.int64)
        return Overlay(RowChunk(none, none, np.empty(0, np.float32)), none)

    @property
    def size(self) -> int:
        return self.changed.size

    def merged(self, rows: RowChunk, deleted: np.ndarray) -> Overlay:
        """This overlay with ``rows`` (encoded, ids unique) written over it and ``deleted`` removed: the last
        word on an id wins, as in the training run (a delta never both changes and deletes one id)."""
        newer = np.union1d(rows.ids, deleted)
        kept = self.changed.take(np.flatnonzero(~holds(newer, self.changed.ids)))
        parts = [c for c in (kept, rows) if c.size]
        both = rows if not parts else parts[0] if len(parts) == 1 else RowChunk.concat(parts)
        both = both.take(np.argsort(both.ids, kind="stable"))
        gone = np.union1d(self.deleted[~holds(np.sort(rows.ids), self.deleted)], deleted).astype(np.int64)
        return Overlay(both, gone)


def holds(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """[N] bool: which of ``ids`` are in ``sorted_ids`` (ascending)."""
    return find_sorted(sorted_ids, ids)[0]


class PatchedTable:
    """A served table (the export's file) with an :class:`Overlay`; looked up like a ServedTable."""

    def __init__(self, base: ServedTable, overlay: Overlay) -> None:
        self.base = base
        self.overlay = overlay
        self.dim = base.dim
        self.changed = in_memory(base.entry, overlay.changed) if overlay.size else None

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Rows [N, dim] float32 of raw ``ids`` [N] int64; zeros for ids the table does not hold (or no longer)."""
        out = self.base.lookup(ids)
        if self.overlay.deleted.size:
            out[holds(self.overlay.deleted, ids)] = 0.0
        if self.changed is not None:
            found, _ = self.changed.find(ids)
            if found.any():
                out[found] = self.changed.lookup(ids[found])
        return out

    def patched(self, rows: RowChunk | None, deleted: np.ndarray | None, precision: str) -> PatchedTable:
        """A new table: this one with ``rows`` (float32, each at its own dims) stored at ``precision`` over it and
        the ids ``deleted`` gone."""
        none = np.empty(0, np.int64)
        rows = Overlay.empty(self.dim).changed if rows is None else encode(rows, precision)
        return PatchedTable(self.base, self.overlay.merged(rows, none if deleted is None else deleted.astype(np.int64)))
