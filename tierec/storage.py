"""The one factory that builds each table group's storage: row layout x placement.

- row layout: whole rows (``TableGroup``), or chunked rows that pruning shortens
  (``PrunedGroup``) when ``prune`` is given;
- placement: memory, or the tiers (fast cache / host DRAM / disk) when the
  :class:`~tierec.store.plan.StorePlan` tiers the group's tables. With a GPU model
  (``train.device = "cuda"``) whole rows live in GPU memory: a plain group all of
  them, a tiered group its fast tier (host DRAM and disk below it, BiPS's bi-tier
  placement); chunked rows stay in host memory and their pooled output crosses
  to the GPU (``tierec.device``).

Whole rows in the tiers are a ``TieredGroup``; chunked rows in the tiers are a
``PrunedGroup`` over a ``TieredChunkPool``. Every result implements
:class:`~tierec.embedding.storage.RowStorage`; nothing above the storage needs
to know which it got. Without a plan nothing is tiered, and without ``prune``
rows are whole: ``storage_factory()`` builds plain groups (an
EmbeddingCollection's default), ``storage_factory(prune=cfg)`` pruned ones.

>>> from tierec.config import PruneConfig, StoreConfig
>>> from tierec.embedding import TableConfig
>>> from tierec.storage import storage_factory
>>> from tierec.store.plan import StorePlan
>>> tables = [TableConfig(name="t", dim=8, features=["f"])]
>>> make = storage_factory(StorePlan(StoreConfig(), [tables]), PruneConfig(chunk=4))
>>> type(make(tables, 0, "cpu")).__name__
'PrunedGroup'
>>> type(storage_factory()(tables, 0, "cpu")).__name__
'TableGroup'
"""

from __future__ import annotations

import torch

from tierec.config import PruneConfig
from tierec.device import storage_device
from tierec.embedding.group import TableGroup
from tierec.embedding.storage import RowStorage, StorageFactory
from tierec.embedding.table import TableConfig
from tierec.store.plan import StorePlan


def storage_factory(plan: StorePlan | None = None, prune: PruneConfig | None = None) -> StorageFactory:
    """``group_factory`` for an EmbeddingCollection: chunked rows when ``prune``, tiers where ``plan`` says
    (no plan: all in memory)."""

    def make(tables: list[TableConfig], seed: int, device: torch.device | str) -> RowStorage:
        tiered = plan is not None and plan.tiered(tables)
        if prune is None:
            if not tiered:
                return TableGroup(tables, seed=seed, device=device)
            from tierec.store.tiered_group import TieredGroup

            return TieredGroup(tables, plan.spec_for(tables), seed=seed, device=device)
        from tierec.prune.group import PrunedGroup, chunk_store_name
        from tierec.prune.pruner import check_chunk_dim

        check_chunk_dim(tables, prune)
        pool = None
        if tiered:
            from tierec.prune.tiered_pool import TieredChunkPool

            dim_state = PrunedGroup.dim_state_of(tables[0].optimizer, tables[0].dim)
            pool = TieredChunkPool(prune.chunk, dim_state, plan.spec_for(tables), seed=seed, name=chunk_store_name(tables))
        # chunked rows stay in host memory; the collection moves their pooled output to the model's device
        return PrunedGroup(tables, prune, seed=seed, device=storage_device(device, device_rows=False), pool=pool)

    return make
