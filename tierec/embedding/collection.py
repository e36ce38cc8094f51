"""EmbeddingCollection: pooled embeddings for every sparse feature, trained in the backward.

Per batch and per table group: (1) dedupe the (table, id) pairs, (2) look the
unique pairs up in the hash index, inserting new ids, (3) gather each unique
row once, (4) pool per feature from the gathered rows. In the backward the
gradient arrives already reduced onto the unique rows and the fused optimizer
updates them in place; no dense gradient of a table is ever formed.

>>> import torch
>>> from tierec.batch import SparseFeatures
>>> from tierec.config import EmbeddingConfig
>>> from tierec.embedding import EmbeddingCollection, tables_from_config
>>> coll = EmbeddingCollection(tables_from_config(EmbeddingConfig(dim=4), ["a", "b"]), ["a", "b"])
>>> sp = SparseFeatures.one_hot(("a", "b"), torch.tensor([[1, 2], [1, 3]]))
>>> out = coll(sp)                # [B, F, D]
>>> out.shape
torch.Size([2, 2, 4])
>>> out.sum().backward()          # rows updated in place, no .grad anywhere
"""

from __future__ import annotations

from typing import Iterator

import numba
import numpy as np
import torch
from torch import Tensor, nn

from tierec.batch import SparseFeatures
from tierec.device import resolve_device, to_device
from tierec.embedding.ahead import Ahead, Prepared
from tierec.embedding.changes import RowChanges
from tierec.embedding.group import TableGroup
from tierec.embedding.hash_index import Deduper
from tierec.embedding.plan import GroupPlan, plan_ids, select_features
from tierec.embedding.pool_ops import BagLayout
from tierec.embedding.pooling import bag_scale, feature_bounds
from tierec.embedding.storage import (
    StorageFactory, load_whole_table_state, record_chunks, records_by_ids, whole_table_state,
)
from tierec.embedding.table import TableConfig


class EmbeddingCollection(nn.Module):
    def __init__(
        self,
        tables: list[TableConfig],
        feature_names: list[str] | tuple[str, ...],
        *,
        seed: int = 0,
        device: torch.device | str = "cpu",
        group_factory: StorageFactory | None = None,
    ) -> None:
        """``group_factory(tables, seed, device)`` builds each physical store (tiered,
        pruned, ...): ``tierec.storage.storage_factory`` from the config; the default is the
        plain in-memory TableGroup (what ``storage_factory()`` builds). ``device`` is the model's:
        pooled embeddings come out there, whichever memory a storage keeps its rows in."""
        super().__init__()
        self.device = resolve_device(device)  # "cuda" as "cuda:N", so outputs already there are not moved again
        self.feature_names = tuple(feature_names)
        self.tables = tables
        owner = {}
        for t in tables:
            for f in t.features:
                if f in owner:
                    raise ValueError(f"feature {f!r} is used by tables {owner[f]!r} and {t.name!r}")
                owner[f] = t.name
        missing = [f for f in self.feature_names if f not in owner]
        if missing:
            raise ValueError(f"features without a table: {missing}")
        by_key: dict[tuple, list[TableConfig]] = {}
        for t in tables:
            by_key.setdefault(t.group_key(), []).append(t)
        make = group_factory or (lambda ts, sd, dev: TableGroup(ts, seed=sd, device=dev))
        self.groups = [make(ts, seed, device) for ts in by_key.values()]
        self.plans = [GroupPlan.of(g, self.feature_names) for g in self.groups]
        self._dedupe = Deduper()
        # Autograd needs a tensor that requires grad to call _Gather.backward.
        self._anchor = torch.zeros((), requires_grad=True)
        # numba gather+pool kernels on CPU; False forces the torch path (what GPUs run).
        self.use_fused_kernels = True

    @property
    def dims(self) -> list[int]:
        return [next(t.dim for t in self.tables if f in t.features) for f in self.feature_names]

    # --------------------------------------------------------------- forward

    def forward(self, sparse: SparseFeatures, ahead: Ahead | None = None) -> Tensor:
        """Pooled embeddings ``[B, F, D]`` in ``feature_names`` order (all tables one dim).

        ``ahead``: what :meth:`prepare` computed for this very batch (e.g. on another
        thread while the previous step ran); the result is the same as without it.
        """
        dims = set(self.dims)
        if len(dims) != 1:
            raise ValueError(f"forward() needs one dim for all tables, got {sorted(dims)}; use pooled_by_feature()")
        prepared = ahead is not None and ahead.sparse is sparse  # the caller's object, before any reselection
        if sparse.keys != self.feature_names:
            sparse = select_features(sparse, self.feature_names)
        parts = ahead.parts if prepared else [None] * len(self.plans)
        outs = [self._group_forward(plan, sparse, part) for plan, part in zip(self.plans, parts)]  # each [B, F_g, D]
        if len(outs) == 1 and self.plans[0].features == tuple(range(len(self.feature_names))):
            return outs[0]
        order = [f for plan in self.plans for f in plan.features]
        perm = torch.from_numpy(np.argsort(order)).to(outs[0].device)
        return torch.cat(outs, dim=1).index_select(1, perm)

    def pooled_by_feature(self, sparse: SparseFeatures) -> dict[str, Tensor]:
        """Pooled embeddings per feature name, each ``[B, D_f]`` (tables may differ in dim)."""
        if sparse.keys != self.feature_names:
            sparse = select_features(sparse, self.feature_names)
        out: dict[str, Tensor] = {}
        for plan in self.plans:
            pooled = self._group_forward(plan, sparse)  # [B, F_g, D]
            for i, f in enumerate(plan.features):
                out[self.feature_names[f]] = pooled[:, i]
        return out

    def prepare(self, sparse: SparseFeatures, dedupe: Deduper | None = None, *, probe: bool = True,
                bring_up: bool = False) -> Ahead:
        """Steps 1 and 2 of :meth:`forward` for a batch, ahead of it: the dedupe, and the rows of
        the ids already in the tables (``probe``: a read-only probe, where the storage offers ``find_rows``).

        Changes no table, so it may run on another thread while a step trains (ScaleFreeCTR's
        pipeline; the trainer's look-ahead, :class:`tierec.embedding.ahead.LookAhead`). Ids still
        missing are inserted by ``forward``, in the same order, so the rows are the same.
        ``dedupe``: scratch space of the calling thread (two threads must not share one).

        ``bring_up``: storages that offer ``lookup_ahead`` (the tiers) do this batch's training
        lookup now, during the previous batch's step, so the batch must then be trained next.
        """
        given = sparse
        if sparse.keys != self.feature_names:
            sparse = select_features(sparse, self.feature_names)
        dd = dedupe if dedupe is not None else self._dedupe
        parts = []
        for plan in self.plans:
            keys, tabs, off = plan_ids(plan, sparse)
            known = self._resolved(plan.group, keys, tabs)
            if known is not None:
                ukeys, utabs, inverse = known.keys, known.tabs, known.inverse
            else:
                split = self._split(plan, off, sparse.batch_size)
                ukeys, utabs, inverse = dd(keys, tabs, None if split is None else off[split * sparse.batch_size])
            rows = self._rows_ahead(plan.group, ukeys, utabs, probe, bring_up, known)
            parts.append(Prepared(ukeys, utabs, inverse, off, rows, known))
        return Ahead(given, parts)

    def brought_up(self, ahead: Ahead) -> bool:
        """Every storage that looks up ahead (the tiers) did this prepared batch's lookup: its :meth:`forward`
        looks nothing up there, so the next batch's lookup may start before it."""
        return all(part.found is not None for plan, part in zip(self.plans, ahead.parts)
                   if getattr(plan.group, "lookup_ahead", None) is not None)

    def group_ids(self, gi: int, sparse: SparseFeatures) -> tuple[np.ndarray, np.ndarray]:
        """(ids [N], tables [N]) of group ``gi``'s features in a batch, in the order its lookup reads them (what
        the store's read-ahead windows keep for :meth:`~tierec.store.group.TierStore.resolve`)."""
        if sparse.keys != self.feature_names:
            sparse = select_features(sparse, self.feature_names)
        keys, tabs, _ = plan_ids(self.plans[gi], sparse)
        return keys, tabs

    @staticmethod
    def _resolved(group, keys: np.ndarray, tabs: np.ndarray):
        """The batch's unique pairs as a read-ahead window of the tiers found them (they replace the dedupe and
        most of the lookup's probe), or None."""
        resolve = getattr(group, "resolve", None)  # optional: the tiers
        return None if resolve is None else resolve(keys, tabs)

    @staticmethod
    def _rows_ahead(group, keys: np.ndarray, tabs: np.ndarray, probe: bool, bring_up: bool, known=None) -> np.ndarray | None:
        """Rows [U] of unique pairs known ahead of the forward (-1: not yet), or None."""
        lookup = getattr(group, "lookup_ahead", None) if bring_up else None  # optional: the tiers
        if lookup is not None:
            rows = lookup(keys, tabs) if known is None else lookup(keys, tabs, known=known)
            return None if rows is None else rows.numpy()
        find = getattr(group, "find_rows", None) if probe else None  # optional: storages with a read-only probe
        return None if find is None else find(keys, tabs)

    @staticmethod
    def _split(plan: GroupPlan, off: np.ndarray, b: int) -> np.ndarray | None:
        """Features with tables of their own: threads split the dedupe and the backward by whole features."""
        threads = numba.get_num_threads()
        if plan.features_own_rows and threads > 1 and len(plan.features) > 1:
            return feature_bounds(off, b, threads)
        return None

    def _group_forward(self, plan: GroupPlan, sparse: SparseFeatures, ahead: Prepared | None = None) -> Tensor:  # -> [B, F_g, D]
        b = sparse.batch_size
        # 1. dedupe, 2. look up (insert when training), 3.+4. gather each unique row once and pool.
        if ahead is None:
            keys, tabs, off = plan_ids(plan, sparse)
            split = self._split(plan, off, b)
            known = self._resolved(plan.group, keys, tabs) if self.training else None  # windows hold training batches
            if known is None:
                ukeys, utabs, inverse = self._dedupe(keys, tabs, None if split is None else off[split * b])
                rows = plan.group.lookup(ukeys, utabs, insert=self.training)  # [U]
            else:
                inverse = known.inverse
                rows = plan.group.lookup(known.keys, known.tabs, insert=self.training, known=known)
        else:  # steps 1 and 2 were prepared (the split is this thread's: it shapes the pooling's threads)
            off, inverse = ahead.offsets, ahead.inverse
            split = self._split(plan, off, b)
            rows = ahead.rest(plan.group, self.training)
        layout = BagLayout(
            inverse=inverse, offsets=off, scale=bag_scale(off, plan.mean, b), batch=b, feature_split=split
        )
        train = self.training and torch.is_grad_enabled()
        pooled = plan.group.pool(rows.numpy(), layout, train=train, anchor=self._anchor, fused=self.use_fused_kernels)
        return to_device(pooled, self.device)  # rows in host memory (chunks), model on a GPU: the seam

    # --------------------------------------------------------------- reports

    def table_stats(self) -> dict[str, dict[str, int]]:
        """Rows and bytes per table (a group's index and slack are shared by row count)."""
        stats = {}
        for g in self.groups:
            counts = g.rows_per_table()
            total = max(int(counts.sum()), 1)
            nbytes = g.nbytes()
            for t, n in zip(g.tables, counts):
                stats[t.name] = {"rows": int(n), "bytes": int(nbytes * int(n) / total)}
        return stats

    def num_rows(self) -> int:
        return sum(g.num_rows for g in self.groups)

    def nbytes(self) -> int:
        return sum(g.nbytes() for g in self.groups)

    def resident_nbytes(self) -> int:
        """Like :meth:`nbytes`, counting only pages in physical memory (spare capacity is not)."""
        return sum(g.resident_nbytes() for g in self.groups)

    # ----------------------------------------------------------------- state

    def state_meta(self) -> dict[str, Tensor]:
        """The small non-row state: ``group{i}.step`` and each table's ``{table}.<meta>`` (counters, clocks)."""
        sd: dict[str, Tensor] = {}
        for gi, g in enumerate(self.groups):
            sd[f"group{gi}.step"] = torch.tensor(g.step, dtype=torch.int64)
            for ti, t in enumerate(g.tables):
                sd.update({f"{t.name}.{k}": v for k, v in g.table_meta(ti).items()})
        return sd

    def iter_rows(self, chunk_bytes: int = 1 << 24) -> Iterator[tuple[str, dict[str, Tensor]]]:
        """``(table name, records)`` of every row, a chunk of at most about ``chunk_bytes`` at a time."""
        for g in self.groups:
            max_rows = max(1, chunk_bytes // g.bytes_per_row())
            for ti, t in enumerate(g.tables):
                for chunk in record_chunks(g, ti, max_rows):
                    yield t.name, chunk

    def load_state_meta(self, sd: dict[str, Tensor]) -> None:
        for gi, g in enumerate(self.groups):
            if f"group{gi}.step" in sd:
                g.step = int(sd[f"group{gi}.step"])
            for ti, t in enumerate(g.tables):
                prefix = f"{t.name}."
                g.load_table_meta(ti, {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)})

    def load_rows(self, table: str, records: dict[str, Tensor]) -> None:
        """Insert (or overwrite) one chunk of ``iter_rows`` output; rows of unknown tables are an error."""
        g, ti = self._table_slot(table)
        g.write_records(ti, records)

    def set_weights(self, table: str, ids: np.ndarray, weights: np.ndarray) -> None:
        """Insert (or overwrite) the weights ``[n, dim]`` of rows ``ids`` (unique) of ``table``; their optimizer
        state is a new row's (a warm start, before the first step)."""
        g, ti = self._table_slot(table)
        tabs = np.full(ids.shape[0], ti, dtype=np.int32)
        fresh = g.empty_in_memory()  # the same row layout: its new rows carry the initial optimizer state
        fresh.lookup(ids, tabs, insert=True)
        _, records = fresh.records_of(ids, tabs)
        records[:, : weights.shape[1]] = weights
        g.put_records(ids, tabs, records)

    # --------------------------------------------------------------- changes

    def track_changes(self) -> None:
        """Every group notes its changed and deleted rows from now on (tierec/embedding/changes.py)."""
        for g in self.groups:
            g.changes.start()

    def mark_changes(self) -> None:
        """The state as of now is published: every group forgets its changes."""
        for g in self.groups:
            g.changes.mark()

    def changes(self) -> list[RowChanges]:
        """Per group: the ids changed and deleted since the last :meth:`mark_changes`."""
        return [g.changes.since_mark() for g in self.groups]

    def changed_rows(self, changes: list[RowChanges], chunk_bytes: int = 1 << 24) -> Iterator[tuple[str, dict[str, Tensor]]]:
        """``(table name, records)`` of the changed rows, like :meth:`iter_rows`, a bounded chunk at a time."""
        for g, ch in zip(self.groups, changes):
            max_rows = max(1, chunk_bytes // g.bytes_per_row())
            for ti, t in enumerate(g.tables):
                ids = ch.changed[ti]
                for lo in range(0, ids.size, max_rows):
                    yield t.name, records_by_ids(g, ti, ids[lo : lo + max_rows])

    def deleted_ids(self, changes: list[RowChanges]) -> dict[str, Tensor]:
        """``{table name: ids}`` deleted since the last mark (tables without deletions left out)."""
        return {t.name: torch.from_numpy(ch.deleted[ti]) for g, ch in zip(self.groups, changes)
                for ti, t in enumerate(g.tables) if ch.deleted[ti].size}

    def delete_rows(self, table: str, ids: Tensor) -> None:
        g, ti = self._table_slot(table)
        keys = ids.numpy().astype(np.int64, copy=False)
        g.delete_records(keys, np.full(keys.shape[0], ti, dtype=np.int32))

    def catch_up(self, sd: dict[str, Tensor]) -> None:
        """Before a delta's :meth:`load_state_meta`: statistics of the rows it does not carry brought forward."""
        for g in self.groups:
            for ti, t in enumerate(g.tables):
                prefix = f"{t.name}."
                g.catch_up(ti, {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)})

    def _table_slot(self, name: str) -> tuple[TableGroup, int]:
        for g in self.groups:
            for ti, t in enumerate(g.tables):
                if t.name == name:
                    return g, ti
        raise KeyError(f"no table {name!r} in this model")

    def state_dict(self, *args, **kwargs) -> dict[str, Tensor]:  # type: ignore[override]
        """Plain tensors only: ``{table}.ids``, ``{table}.weights``, ``{table}.opt.*``, ``group{i}.step``."""
        sd: dict[str, Tensor] = {}
        for gi, g in enumerate(self.groups):
            sd[f"group{gi}.step"] = torch.tensor(g.step, dtype=torch.int64)
            for ti, t in enumerate(g.tables):
                for k, v in whole_table_state(g, ti).items():
                    sd[f"{t.name}.{k}"] = v
        return sd

    def load_state_dict(self, sd: dict[str, Tensor], strict: bool = True) -> None:  # type: ignore[override]
        for gi, g in enumerate(self.groups):
            g.step = int(sd[f"group{gi}.step"])
            for ti, t in enumerate(g.tables):
                prefix = f"{t.name}."
                part = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
                if not part:
                    if strict:
                        raise KeyError(f"state dict has no rows for table {t.name!r}")
                    continue
                load_whole_table_state(g, ti, part)

