"""TableGroup: the plain storage (whole rows, in memory) of tables that share dim and optimizer.

Like a table-batched kernel, one group holds the rows of many logical tables
in one weight tensor behind one HashIndex keyed by (table, id), so a batch
costs one dedupe, one lookup and one update for all of them, not one per table.

>>> import numpy as np, torch
>>> from tierec.embedding.table import TableConfig
>>> from tierec.embedding.group import TableGroup
>>> g = TableGroup([TableConfig(name="t", dim=4, features=["f"])], seed=0)
>>> rows = g.lookup(np.array([5, 6], dtype=np.int64), np.zeros(2, dtype=np.int32), insert=True)
>>> g.gather(rows.numpy()).shape
torch.Size([2, 4])

It implements :class:`~tierec.embedding.storage.RowStorage`; it is the
reference every other storage is tested against.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from torch import Tensor

from tierec.config import OptimizerKind
from tierec.embedding import kernels
from tierec.embedding.arena import GrowableArray, resident_bytes
from tierec.embedding.changes import ChangeTracker
from tierec.embedding.hash_index import HashIndex
from tierec.embedding.layout import RecordLayout
from tierec.embedding.optimizers import apply_update
from tierec.embedding.pool_ops import BagLayout, pool_dense
from tierec.embedding.pooling import fused_pays, host_has_avx512, reduce_update_rowwise
from tierec.embedding.table import TableConfig, group_layout


class TableGroup:
    counts_accesses = False  # update() ignores how many ids each row served

    def __init__(self, tables: list[TableConfig], seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.tables = tables
        self.dim, self.optimizer = group_layout(tables)
        self.seed = seed  # of new rows' values
        self.device = torch.device(device)
        self.layout = RecordLayout.of_tables(tables)  # each row: weights, optimizer state; new rows' scales
        self.step = 0  # updates applied (Adam's bias correction)
        self.changes = ChangeTracker(len(tables))  # rows changed since the last publication, once started
        self.avx512 = self.device.type == "cpu" and host_has_avx512()  # picks the faster backward (fused_pays)
        self.index = HashIndex(n_tables=len(tables))
        self.weights = torch.empty(self.index.row_capacity, self.dim, device=self.device)  # [R, D]
        self.state = self.layout.new_state(self.index.row_capacity, self.device)
        self._owned: dict[str, GrowableArray] | None = None  # CPU: the memory behind weights/state once grown
        self.record_width = self.layout.width

    @property
    def num_rows(self) -> int:
        return self.index.num_rows

    def __getstate__(self) -> dict:
        # A copy (copy.deepcopy, pickle) gets the weights and state as plain tensors; the
        # growable arrays behind them are rebuilt from those at its first growth. Copied
        # separately, the arrays would hold the rows as of the copy while training the
        # copy changes the tensors, and a growth would bring the old values back.
        return {**self.__dict__, "_owned": None}

    # ------------------------------------------------------------------ rows

    def _grow_storage(self) -> None:
        cap, old = self.index.row_capacity, self.weights.shape[0]
        if cap <= old:
            return
        if self.device.type == "cpu":
            self._grow_in_place(cap, old)
            return
        w = torch.empty(cap, self.dim, device=self.device)
        w[:old].copy_(self.weights)
        self.weights = w
        fresh = self.layout.new_state(cap, self.device)
        for name, s in self.state.items():
            fresh[name][:old].copy_(s)
        self.state = fresh

    def _grow_in_place(self, cap: int, old: int) -> None:
        """CPU: grow weights and state without a fresh block and a copy, and without touching the new tail.

        Each array is a :class:`~tierec.embedding.arena.GrowableArray` (an anonymous
        mapping grown with mremap): the rows kept move by remapping their pages, and the
        spare capacity is not faulted in until rows are inserted there, so it costs
        address space, not memory (``ndarray.resize`` zero-filled the tail at once,
        faulting in every new page). New rows get their values and optimizer state in
        :meth:`_init_rows`, so the tail needs no fill. The tensors are views this group
        owns and are replaced here; callers read ``self.weights`` / ``self.state``
        afresh at every use, never across a growth.
        """
        if self._owned is None:  # first growth: own the memory behind the tensors
            self._owned = {"weights": GrowableArray(self.weights.numpy())}
            self._owned.update({n: GrowableArray(t.numpy()) for n, t in self.state.items()})
        arrays = {name: g.grow(cap, old) for name, g in self._owned.items()}
        self.weights = torch.from_numpy(arrays["weights"])
        self.state = {n: torch.from_numpy(arrays[n]) for n in self.state}

    def lookup(self, keys: np.ndarray, tabs: np.ndarray, insert: bool) -> Tensor:
        """Rows [U] int64 of unique (table, key) pairs; new ones are inserted and initialised.

        Without ``insert`` an unknown pair gets row -1.
        """
        found = self.index.lookup(keys, tabs, insert)
        if insert:
            self._grow_storage()
            if found.new.size:
                self._init_rows(found.rows[found.new], keys[found.new], tabs[found.new])
        return torch.from_numpy(found.rows)

    def find_rows(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:
        """Rows [U] int64 of the known (table, key) pairs, -1 for the rest; reads only, so it may
        run beside a training step (the collection's ``prepare``). Storages whose ``lookup`` does
        more than find and insert set this to None."""
        return self.index.lookup(keys, tabs, insert=False).rows

    def _init_rows(self, rows: np.ndarray, keys: np.ndarray, tabs: np.ndarray) -> None:
        init_dense_rows(self.weights, self.state, self.layout, self.seed, rows, keys, tabs)
        self.changes.changed(keys, tabs)

    def pool(self, rows: np.ndarray, layout: BagLayout, *, train: bool, anchor: Tensor, fused: bool = True) -> Tensor:
        """Pooled ``[B, F_g, D]`` from unique ``rows`` [U]; when ``train`` the backward updates them.

        ``fused`` picks the numba kernels on CPU; the torch path runs elsewhere.
        """
        return pool_dense(self, rows, layout, train=train, anchor=anchor, fused=fused)

    def gather(self, rows: np.ndarray) -> Tensor:  # [U, D] of ``rows``; -1 (unknown id) reads zeros
        return gather_dense(self.weights, rows)

    def update(self, rows: Tensor, grad: Tensor, *, accesses: np.ndarray | None = None) -> None:
        """One fused optimizer step on unique ``rows`` [U] with ``grad`` [U, D] (``accesses`` unused)."""
        self.step += 1
        apply_update(self.optimizer, self.weights, self.state, rows, grad, self.step)
        if self.changes.on:
            self.changes.changed(*self._row_pairs(rows.cpu().numpy()))

    def fused_reduce_update(self, features_own_rows: bool = False) -> bool:
        """True when the backward may reduce and update in one row-parallel pass (pooling.reduce_update_rowwise)
        instead of ``pool_backward`` + :meth:`update`: row-wise Adagrad on CPU, where ``pooling.fused_pays``
        for this dim, thread count and host (``features_own_rows``: the batch's layout splits the
        two-pass backward by feature). A storage whose ``update`` does more than the optimizer step
        overrides this with False."""
        return (
            self.optimizer.kind is OptimizerKind.ROWWISE_ADAGRAD
            and self.device.type == "cpu"
            and fused_pays(self.dim, numba.get_num_threads(), self.avx512, features_own_rows)
        )

    def reduce_update(self, grad_out: np.ndarray, rows: np.ndarray, layout: BagLayout) -> None:
        """The backward of a pooled batch and the optimizer step in one pass (see :meth:`fused_reduce_update`)."""
        self.step += 1
        if self.changes.on:
            self.changes.changed(*self._row_pairs(rows))
        cfg = self.optimizer
        threads = numba.get_num_threads()
        reduce_update_rowwise(
            grad_out, layout.inverse, layout.offsets, layout.scale, layout.batch, rows,
            self.weights.numpy(), self.state["sum"].numpy(),
            np.float32(cfg.lr), np.float32(cfg.eps), np.float32(cfg.weight_decay), 4 * threads, threads,
        )  # fmt: skip

    # ----------------------------------------------------------- reporting

    def rows_per_table(self) -> np.ndarray:  # [n_tables]
        return self.index.rows_per_table(len(self.tables))

    def bytes_per_row(self) -> int:  # bytes of weights plus optimizer state for one row
        per = self.dim * 4
        for t in self.state.values():
            per += t[0].numel() * 4
        return per

    def nbytes(self) -> int:  # bytes allocated: weights, optimizer state, index
        total = self.weights.numel() * 4 + sum(t.numel() * 4 for t in self.state.values())
        return total + self.index.nbytes()

    def resident_nbytes(self) -> int:
        """Bytes of weights, optimizer state and index in physical memory (pages written so far;
        spare capacity that no row has reached yet is not). Equals :meth:`nbytes` off Linux
        and on other devices."""
        if self.device.type != "cpu":
            return self.nbytes()
        arrays = [self.weights.numpy(), *(t.numpy() for t in self.state.values())]
        return sum(resident_bytes(a) for a in arrays) + self.index.resident_nbytes()

    def tier_stores(self) -> list:  # no tiered store behind a plain group
        return []

    def prefetcher(self) -> None:  # rows in memory: nothing to bring up ahead
        return None

    def pruning(self) -> None:  # whole rows: nothing to prune
        return None

    def empty_in_memory(self) -> TableGroup:
        """An empty storage of the same tables, seed and device in memory (a hot-row replica)."""
        return TableGroup(self.tables, seed=self.seed, device=self.device)

    def close(self) -> None:
        pass

    # ------------------------------------------------------------ records

    def _record_of(self, rows: Tensor) -> np.ndarray:  # [n, record_width]: weights, then each state flattened
        parts = [self.weights.index_select(0, rows)]
        parts += [s.index_select(0, rows).reshape(rows.shape[0], -1) for s in self.state.values()]
        return torch.cat(parts, 1).cpu().numpy()

    def records_of(self, keys: np.ndarray, tabs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = self.index.lookup(keys, tabs.astype(np.int32, copy=False), insert=False).rows
        found = rows >= 0
        out = np.zeros((keys.shape[0], self.record_width), dtype=np.float32)
        if found.any():
            out[found] = self._record_of(torch.from_numpy(rows[found]).to(self.device))
        return found, out

    def put_records(self, keys: np.ndarray, tabs: np.ndarray, records: np.ndarray) -> None:
        rows = self.lookup(keys, tabs.astype(np.int32, copy=False), insert=True).to(self.device)
        self.changes.changed(keys, tabs)
        rec = torch.from_numpy(np.ascontiguousarray(records, dtype=np.float32)).to(self.device)
        self.weights[rows] = rec[:, : self.dim]
        col = self.dim
        for s in self.state.values():
            w = int(np.prod(s.shape[1:], dtype=np.int64))
            s[rows] = rec[:, col : col + w].reshape(rows.shape[0], *s.shape[1:])
            col += w

    # ------------------------------------------------------------ state

    # Checkpoints stream a table as row records in bounded chunks (``storage.record_chunks`` over
    # ``rows_of`` and ``records``), ``write_records`` takes them back (insert or overwrite), and the
    # table's few non-row tensors travel apart (``table_meta`` / ``load_table_meta``).
    # ``storage.whole_table_state`` / ``load_whole_table_state``: the whole table at once (small tables, tests).

    def row_extent(self) -> int:
        """Row numbers in use lie in ``[0, row_extent())`` (holes allowed)."""
        return self.index.num_rows

    def rows_of(self, t: int, lo: int, hi: int) -> np.ndarray:
        """Rows [n] int64 of table ``t`` among row numbers ``[lo, hi)``, ascending."""
        return lo + np.flatnonzero(self.index.row_tabs[lo:hi] == t)

    def records(self, t: int, rows: np.ndarray) -> dict[str, Tensor]:
        """Row records of ``rows`` (all of table ``t``): ids [n], weights [n, D], opt.* [n, ...]."""
        r = torch.from_numpy(rows).to(self.device)
        out = {"ids": torch.from_numpy(self.index.row_keys[rows]), "weights": self.weights.index_select(0, r).cpu()}
        for name, s in self.state.items():
            out[f"opt.{name}"] = s.index_select(0, r).cpu()
        return out

    def table_meta(self, t: int) -> dict[str, Tensor]:
        """Non-row state of table ``t`` (counters, clocks); none for a plain group."""
        return {}

    def load_table_meta(self, t: int, sd: dict[str, Tensor]) -> None:
        """Put back what ``table_meta`` gave (extra keys are ignored)."""

    def write_records(self, t: int, sd: dict[str, Tensor]) -> None:
        """Insert (or overwrite) the rows of one chunk of ``record_chunks`` output."""
        ids = sd["ids"].numpy().astype(np.int64, copy=False)
        tabs = np.full(ids.shape[0], t, dtype=np.int32)
        rows = self.lookup(ids, tabs, insert=True).to(self.device)
        self.changes.changed(ids, tabs)
        self.weights[rows] = sd["weights"].to(self.device)
        for name, s in self.state.items():
            s[rows] = sd[f"opt.{name}"].to(self.device)

    # ----------------------------------------------- changes (delta checkpoints)

    # Tracking (``changes``, off until started): rows written since the last mark (optimizer
    # updates, insertions, overwrites) and rows deleted; tierec/embedding/changes.py.

    def _row_pairs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids, tables) of row numbers ``rows`` (what ``lookup`` returned)."""
        rows = np.asarray(rows, dtype=np.int64)
        return self.index.row_keys[rows], self.index.row_tabs[rows]

    def record_rows(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:
        """What :meth:`records` takes for known ``(table, id)`` pairs (-1: unknown); moves nothing."""
        return self.index.lookup(keys, tabs, insert=False).rows

    def delete_records(self, keys: np.ndarray, tabs: np.ndarray) -> None:
        """Forget rows of (table, id) pairs; a plain group never deletes, so it holds none of them."""
        held = self.record_rows(np.asarray(keys, dtype=np.int64), np.asarray(tabs, dtype=np.int32)) >= 0
        if held.any():
            raise ValueError(f"a plain table group cannot delete rows (id {int(np.asarray(keys)[held][0])}); "
                             "load this checkpoint with the store that wrote it")

    def catch_up(self, t: int, sd: dict[str, Tensor]) -> None:
        """Bring statistics of rows a delta does not carry forward to the delta's clock (``sd``: its
        ``table_meta``), before its meta and rows are loaded; a plain group keeps none."""


# Whole rows in a weights tensor [R, D] beside their optimizer state: a plain group's rows, and a tiered
# group's fast tier (tierec/store/group.py and tiered_group.py) share these.


def init_dense_rows(
    weights: Tensor,
    state: dict[str, Tensor],
    layout: RecordLayout,
    seed: int,
    rows: np.ndarray,
    keys: np.ndarray,
    tabs: np.ndarray,
) -> None:
    """Give new rows ``rows`` (of ids ``keys`` in key spaces ``tabs``) their initial values, a function of
    ``(seed, table, id)`` alone (the same wherever the row lives), or zeros where ``layout`` has no
    scales, and fresh optimizer state."""
    r = torch.from_numpy(rows).to(weights.device)
    if layout.scales is None:
        weights[r] = 0.0
    elif weights.device.type == "cpu":
        kernels.init_rows(weights.numpy(), rows, keys, tabs.astype(np.int32), layout.scales, seed)
    else:
        w = np.empty((rows.shape[0], weights.shape[1]), dtype=np.float32)
        kernels.init_rows(w, np.arange(rows.shape[0]), keys, tabs.astype(np.int32), layout.scales, seed)
        weights[r] = torch.from_numpy(w).to(weights.device)
    # Optimizer state of a reused row number must start fresh as well.
    for name, column in layout.state.items():
        state[name][r] = column.initial


def gather_dense(weights: Tensor, rows: np.ndarray) -> Tensor:
    """[U, D] of ``rows`` of ``weights``; -1 (unknown id) reads zeros."""
    r = torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(weights.device)
    out = weights.index_select(0, r.clamp(min=0))
    known = r >= 0
    if not bool(known.all()):
        out[~known] = 0.0
    return out
