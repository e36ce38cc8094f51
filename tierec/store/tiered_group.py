"""TieredGroup: the storage of a table group's whole rows in the tiers.

The :class:`~tierec.store.group.TierStore` of a table group's rows
(``RecordLayout.of_tables``), which also trains them (``update`` with the
tables' optimizer, ``pool``) and so implements
:class:`~tierec.embedding.storage.RowStorage`: the engine's kernels read and
update its fast tier as they read a plain group's table, because ``lookup``
returns fast-tier slots.

>>> import numpy as np, tempfile
>>> from tierec.embedding.table import TableConfig
>>> from tierec.store.tiered_group import TieredGroup
>>> from tierec.store.spec import TierSpec
>>> spec = TierSpec(cache_bytes=4 * 20, host_bytes=0, disk_dir=tempfile.gettempdir())
>>> g = TieredGroup([TableConfig(name="t", dim=4, features=["f"])], spec)
>>> g.capacity  # 20 bytes per row: 4 floats of weights and 1 of row-wise Adagrad state
4
>>> for batch in ([1, 2, 3], [4, 5], [1, 6]):
...     rows = g.lookup(np.array(batch, dtype=np.int64), np.zeros(len(batch), dtype=np.int32), insert=True)
>>> g.num_rows, g.stats()["t"]["rows_disk"] > 0
(6, True)
>>> g.close()
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from tierec.embedding.group import TableGroup, gather_dense
from tierec.embedding.layout import RecordLayout
from tierec.embedding.optimizers import apply_update
from tierec.embedding.pool_ops import BagLayout, pool_dense
from tierec.embedding.table import TableConfig
from tierec.store.fast_tier import ZERO_SLOT
from tierec.store.group import TierStore
from tierec.store.spec import TierSpec


class TieredGroup(TierStore):
    """A table group's :class:`~tierec.embedding.storage.RowStorage` in the tiers: a :class:`TierStore` of
    its tables' rows (:meth:`RecordLayout.of_tables`), trained by its optimizer."""

    counts_accesses = False  # update() ignores how many ids each row served

    def __init__(
        self, tables: list[TableConfig], spec: TierSpec, seed: int = 0, device: torch.device | str = "cpu"
    ) -> None:
        super().__init__(RecordLayout.of_tables(tables), spec, seed, device)
        self.tables = tables
        self.optimizer = tables[0].optimizer  # shared by the tables (RecordLayout.of_tables checked)
        self.step = 0  # updates applied (Adam's bias correction)

    def pool(self, rows: np.ndarray, layout: BagLayout, *, train: bool, anchor: Tensor, fused: bool = True) -> Tensor:
        """Pooled ``[B, F_g, D]`` from the fast-tier slots ``rows`` [U] (a plain group's ``pool``)."""
        return pool_dense(self, rows, layout, train=train, anchor=anchor, fused=fused)

    def gather(self, rows: np.ndarray) -> Tensor:  # [U, D] of fast-tier slots ``rows``; -1 reads zeros
        return gather_dense(self.weights, rows)

    def update(self, rows: Tensor, grad: Tensor, *, accesses: np.ndarray | None = None) -> None:
        """The optimizer step on the batch's slots; rows reading the shared zero row are skipped."""
        if self.spec.admission:
            keep = rows != ZERO_SLOT
            if not bool(keep.all()):
                rows, grad = rows[keep], grad[keep]
        self.step += 1
        apply_update(self.optimizer, self.weights, self.state, rows, grad, self.step)
        if self.changes.on:
            self.changes.changed(*self._row_pairs(rows.cpu().numpy()))

    def fused_reduce_update(self, features_own_rows: bool = False) -> bool:
        return False  # the update skips the shared zero slot: always the two-pass backward

    def reduce_update(self, grad_out: np.ndarray, rows: np.ndarray, layout: BagLayout) -> None:
        raise NotImplementedError("a tiered group's backward is two passes (fused_reduce_update() is False)")

    def pruning(self) -> None:  # whole rows: nothing to prune
        return None

    def empty_in_memory(self) -> TableGroup:
        """An empty plain group of the same tables, seed and device (a hot-row replica: whole rows)."""
        return TableGroup(self.tables, seed=self.seed, device=self.device)

