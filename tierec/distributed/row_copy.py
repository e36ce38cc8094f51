"""RowCopy: a row as it moves between an owner's storage and the hot replica, whatever the row layout.

A hot row lives in a replica on every rank while its owner's copy is stale
(``hot.HotReplica``). When it moves (it joins or leaves the hot set, the
replica is flushed to the owners before a checkpoint or a pruning step, or
read back from them afterwards) everything the row is made of goes with it:

- its record (``records_of`` / ``put_records``): weights and optimizer state,
  and for a pruned row its dims (the record's last column), so a replica keeps
  each row's own dims;
- for a storage that scores rows for pruning (``pruning()`` is not None), what
  the pruner scores it by (``importance_of`` / ``put_importance``): a hot row's
  importance grows in the replica, and the owner's pruner must see it.

>>> import numpy as np
>>> from tierec.config import PruneConfig
>>> from tierec.embedding.table import TableConfig
>>> from tierec.prune import PrunedGroup
>>> g = PrunedGroup([TableConfig(name="t", dim=4, features=["f"])], PruneConfig(chunk=2))
>>> keys, tabs = np.array([7]), np.zeros(1, dtype=np.int32)
>>> g.set_row_dims(g.lookup(keys, tabs, insert=True).numpy(), np.array([2]))
>>> copy = RowCopy.of(g)
>>> replica = g.empty_in_memory()
>>> copy.write(replica, keys, tabs, copy.read(g, keys, tabs)[1])
>>> copy.record_width, copy.importance_width, replica.live_chunks(np.array([0])).tolist()  # row 0: 1 chunk of 2
(6, 4, [1])

(A record: 4 weights, row-wise Adagrad's sum, the dims; importance: each of the 2 chunk positions, the claim
to grow back, the access count.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tierec.embedding.storage import RowStorage


@dataclass(frozen=True)
class RowCopy:
    """Reads and writes rows of one row layout as ``[n, width]`` floats: the record, then the importance."""

    record_width: int  # floats of a record (``RowStorage.record_width``)
    importance_width: int  # floats of importance (0: the storage scores nothing)

    @staticmethod
    def of(storage: RowStorage) -> RowCopy:
        scored = storage.pruning()
        return RowCopy(storage.record_width, scored.importance_width if scored is not None else 0)

    @property
    def width(self) -> int:
        return self.record_width + self.importance_width

    def read(self, storage: RowStorage, keys: np.ndarray, tabs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found [n] bool, rows [n, width] float32; zeros where not found) of unique (``tabs``, ``keys``)."""
        found, records = storage.records_of(keys, tabs)
        if not self.importance_width:
            return found, records
        _, importance = storage.pruning().importance_of(keys, tabs)
        return found, np.concatenate([records, importance], axis=1)

    def write(self, storage: RowStorage, keys: np.ndarray, tabs: np.ndarray, rows: np.ndarray) -> None:
        """Insert or overwrite unique (``tabs``, ``keys``) with ``rows`` [n, width] (dims first, then importance)."""
        storage.put_records(keys, tabs, rows[:, : self.record_width])
        if self.importance_width:
            storage.pruning().put_importance(keys, tabs, rows[:, self.record_width :])
