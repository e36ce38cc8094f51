"""RowStorage: the one interface of a table group's storage, and its optional capabilities.

Every table group keeps its rows behind this interface, whatever their layout
(whole rows, or chunked rows that pruning shortens) and placement (memory, or
a bounded fast tier over host DRAM and disk):

=================  =====================  ==================================
layout \\ placement  memory                 tiers (cache / host / disk)
=================  =====================  ==================================
whole rows          ``TableGroup``         ``store.tiered_group.TieredGroup``
chunked rows        ``PrunedGroup`` over   ``PrunedGroup`` over a
                    a ``ChunkPool``        ``TieredChunkPool``
=================  =====================  ==================================

One factory (``tierec.storage.storage_factory``) decides which a table gets.
The two whole-row storages share no base class: each describes its records
with a :class:`~tierec.embedding.layout.RecordLayout` and both use the
whole-row helpers of tierec/embedding/group.py; the tiers themselves are a
``store.group.TierStore``, which a tiered chunk pool holds as well.
Everything above the storage (the collection, the sharded collection and its
hot-row replication, the store's pipeline and monitor, the pruner,
checkpoints) uses only these methods:

- ``lookup(keys, tabs, insert)``: find (or insert) unique ``(table, id)``
  pairs; returns the storage's row numbers, valid until its next lookup;
- ``pool(rows, layout, ...)``: gather those rows and pool them, with the
  fused optimizer as the backward; ``gather(rows)``: the rows as ``[U, D]``;
- ``update(rows, grad, accesses=None)``: the fused optimizer on unique rows
  (``accesses``: how many ids of the batch each row served, for storages that
  count them);
- ``records_of`` / ``put_records``: whole row records (weights and optimizer
  state, ``record_width`` floats) by ``(table, id)``, wherever they live, for
  moves between tiers and ranks (hot-row replication); ``empty_in_memory()``:
  an empty storage of the same row layout in memory (a hot-row replica);
- ``rows_of`` / ``records`` / ``write_records`` (and ``table_meta`` /
  ``load_table_meta``): a table's rows as named tensors (checkpoints), which the
  functions below stream in bounded chunks (``record_chunks``) or give as the
  whole table at once (``whole_table_state`` / ``load_whole_table_state``);
  ``changes``: a :class:`~tierec.embedding.changes.ChangeTracker` of the rows
  written and deleted since the last publication (delta checkpoints), whose
  records ``record_rows`` and ``records`` give;
- bytes (``nbytes``, ``resident_nbytes``) and statistics (``rows_per_table``,
  ``tier_stores``: the tiered stores behind it, for the store's monitor).

Optional capabilities are separate small protocols, reached by asking the
storage (``prefetcher()``, ``pruning()``), never by testing its class; two
optional methods serve the training pipeline's look-ahead where a storage has
them (``getattr(storage, name, None)``): ``find_rows(keys, tabs)``, a read-only
probe of the next batch (plain groups), and ``lookup_ahead(keys, tabs)``, the
next batch's whole lookup during the current step (the tiers); the tiers also
have ``resolve(keys, tabs)``, a batch's unique pairs from the read-ahead window
that holds it, which their ``lookup`` takes as ``known``.

>>> from tierec.embedding.group import TableGroup
>>> from tierec.embedding.storage import RowStorage
>>> from tierec.embedding.table import TableConfig
>>> g: RowStorage = TableGroup([TableConfig(name="t", dim=4, features=["f"])])
>>> g.prefetcher() is None and g.pruning() is None, g.record_width  # 4 weights, 1 float of row-wise Adagrad
(True, 5)
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch import Tensor

from tierec.config import OptimizerConfig
from tierec.embedding.changes import ChangeTracker
from tierec.embedding.table import TableConfig


class Prefetching(Protocol):
    """A storage that can read the rows of upcoming batches from its slow tier ahead of time
    (what tierec/store/pipeline.py uses)."""

    staging: Any  # tierec.store.staging.Staging: its ``stats``

    def stage(self, keys: np.ndarray, tabs: np.ndarray, next_use: np.ndarray | None = None) -> int | None:
        """Start reading ahead the slow-tier rows of unique pairs (changes no number); ``next_use``: the lookup
        each is last needed at, counted from now; a token or None. A storage that also has
        ``resolve(keys, tabs)`` (the tiers) takes a fourth argument, the window's batches
        (tierec.store.staging.BatchIds), and resolves each batch's lookup from the window's dedupe and probe,
        and a fifth, the lids its ``foresee`` found of ``keys`` (tierec.store.staging.Found) or None."""
        ...

    def foresee(self, keys: np.ndarray, tabs: np.ndarray) -> Any:
        """The unique pairs of the training batch after the last one foreseen, for eviction by next use
        (tierec/store/horizon.py); reads nothing. What it found of them (the fifth argument of ``stage``), or
        None."""
        ...

    def release_staged(self, token: int | None = None) -> None:
        """Drop a window read ahead (every window without a token, and the batches foreseen)."""
        ...

    def read_ahead_fill(self) -> tuple[int, int, int | None]:
        """(rows not read ahead for want of room so far, bytes the windows hold, bytes they may hold; None: no bound)."""
        ...


class ChunkImportance(Protocol):
    """A storage of chunked rows whose trailing chunks the pruner frees by importance."""

    chunk: int
    n_pos: int
    pruned: np.ndarray
    regrown: np.ndarray
    evicted: np.ndarray

    @property
    def num_rows(self) -> int: ...

    def keep_scores(self, min_chunks: int, regrow: bool, margin: float) -> np.ndarray: ...

    def tie_keys(self) -> np.ndarray: ...

    def chunk_bytes(self) -> int: ...

    def row_bytes(self) -> int: ...

    def apply_counts(self, counts: np.ndarray) -> tuple[int, int]: ...

    def decay_importance(self, factor: float) -> None: ...

    def evict_empty_rows(self) -> int: ...

    def maybe_compact(self, over_budget: bool, free_fraction: float) -> bool: ...

    def full_value_bytes(self) -> int: ...

    def pool_bytes(self) -> int: ...

    def row_state_bytes(self) -> int: ...

    def value_bytes(self) -> int: ...

    def nbytes(self) -> int: ...

    def dim_histogram(self) -> np.ndarray: ...

    # what the pruner scores rows by, by (table, id) (cross-group averaging sums it across replicas)
    @property
    def importance_width(self) -> int: ...

    def importance_of(self, keys: np.ndarray, tabs: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def put_importance(self, keys: np.ndarray, tabs: np.ndarray, values: np.ndarray) -> None: ...


class RowStorage(Protocol):
    """The storage of one table group (tables sharing dim and optimizer)."""

    tables: list[TableConfig]
    dim: int
    optimizer: OptimizerConfig
    seed: int
    device: torch.device
    step: int  # updates applied (Adam's bias correction)
    record_width: int  # float32 per row record: weights, then every optimizer state flattened
    counts_accesses: bool  # update() uses ``accesses`` (callers that sum gradients sum these too)
    changes: ChangeTracker  # rows written and deleted since the last publication, once started

    @property
    def num_rows(self) -> int: ...

    # -- rows of a batch
    def lookup(self, keys: np.ndarray, tabs: np.ndarray, insert: bool) -> Tensor: ...

    def gather(self, rows: np.ndarray) -> Tensor: ...

    def pool(self, rows: np.ndarray, layout: Any, *, train: bool, anchor: Tensor, fused: bool = True) -> Tensor: ...

    def update(self, rows: Tensor, grad: Tensor, *, accesses: np.ndarray | None = None) -> None: ...

    # -- whole records, by (table, id)
    def records_of(self, keys: np.ndarray, tabs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found [n] bool, records [n, record_width] float32; zeros where not found)."""
        ...

    def put_records(self, keys: np.ndarray, tabs: np.ndarray, records: np.ndarray) -> None:
        """Insert or overwrite the rows of unique pairs with ``records`` [n, record_width]."""
        ...

    # -- tables as named tensors, streamed (checkpoints)
    def row_extent(self) -> int:
        """Row numbers of ``records`` in use lie in ``[0, row_extent())`` (holes allowed)."""
        ...

    def rows_of(self, t: int, lo: int, hi: int) -> np.ndarray:
        """Row numbers [n] of table ``t`` among ``[lo, hi)``, ascending."""
        ...

    def record_rows(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:
        """The row numbers ``records`` takes of known ``(table, id)`` pairs (-1: unknown); moves nothing."""
        ...

    def records(self, t: int, rows: np.ndarray) -> dict[str, Tensor]: ...

    def bytes_per_row(self) -> int: ...

    def write_records(self, t: int, sd: dict[str, Tensor]) -> None: ...

    def table_meta(self, t: int) -> dict[str, Tensor]: ...

    def load_table_meta(self, t: int, sd: dict[str, Tensor]) -> None: ...

    # -- bytes and statistics
    def rows_per_table(self) -> np.ndarray: ...

    def nbytes(self) -> int: ...

    def resident_nbytes(self) -> int: ...

    def tier_stores(self) -> list[Any]: ...

    # -- optional capabilities
    def prefetcher(self) -> Prefetching | None: ...

    def pruning(self) -> ChunkImportance | None: ...

    def empty_in_memory(self) -> RowStorage:
        """An empty storage of the same tables, seed, device and row layout, in memory (a hot-row replica)."""
        ...

    def close(self) -> None: ...


# Table-state entries (``whole_table_state`` output) by how shards of one table combine: one value per row
# (concatenated in shard order, like the ids), event counts (summed), anything else (the same on every
# shard, or a statistic of the first: the first shard's).
_ROW_ENTRIES = ("ids", "weights", "dims", "next_importance", "access_count", "store.freq", "store.last", "store.slot")
_COUNT_ENTRIES = ("pruned_chunks", "regrown_chunks", "evicted_rows", "store.counters")


def record_chunks(storage: Any, t: int, max_rows: int):
    """Row records of table ``t`` of a storage in chunks of at most ``max_rows`` rows (row order).

    Uses only the storage's ``row_extent``, ``rows_of`` and ``records``, so every row layout shares it.
    """
    extent = storage.row_extent()
    step = max(int(max_rows), 1)
    for lo in range(0, extent, step):
        rows = storage.rows_of(t, lo, min(lo + step, extent))
        if rows.size:
            yield storage.records(t, rows)


def whole_table_state(storage: Any, t: int) -> dict[str, Tensor]:
    """The whole table ``t`` of a storage at once: its meta and the records of all its rows."""
    return {**storage.table_meta(t), **storage.records(t, storage.rows_of(t, 0, storage.row_extent()))}


def load_whole_table_state(storage: Any, t: int, sd: dict[str, Tensor]) -> None:
    """Insert (or overwrite) the rows of table ``t`` of a storage from ``whole_table_state`` output."""
    storage.load_table_meta(t, sd)
    storage.write_records(t, sd)


def records_by_ids(storage: Any, t: int, ids: np.ndarray) -> dict[str, Tensor]:
    """Row records (as ``record_chunks`` yields them) of known ids of table ``t`` of a storage, in their order."""
    ids = np.asarray(ids, dtype=np.int64)
    rows = storage.record_rows(ids, np.full(ids.shape[0], t, dtype=np.int32))
    if (rows < 0).any():
        raise KeyError(f"table {storage.tables[t].name!r} has no row of id {int(ids[rows < 0][0])}")
    return storage.records(t, rows)


def is_count_entry(key: str) -> bool:
    """Whether a table-state entry is an event count (shards' values add up)."""
    return key.endswith(tuple("." + e for e in _COUNT_ENTRIES))


def combine_shards(key: str, values: list[Tensor]) -> Tensor:
    """One table-state entry (``<table>.ids``, ``<table>.opt.sum``, ``<table>.chunked.weights``, ...) of
    every shard, as one process's state would hold it."""
    if key.endswith(tuple("." + e for e in _ROW_ENTRIES)) or ".opt." in key or ".chunked." in key:
        return torch.cat(values)
    if is_count_entry(key):
        return torch.stack(values).sum(0)
    return values[0]


# builds the storage of the tables of one group: (tables, seed, device) -> storage
StorageFactory = Callable[[list[TableConfig], int, "torch.device | str"], RowStorage]
