"""Hierarchical training: a job's components on the ("replica", "shard") mesh (``dist.group_size``).

``Hierarchical(layout, cfg)`` runs on a job's ``layout.Layout`` of several
groups (``Hierarchical.build`` makes the layout too, and returns None for a flat
job: today's run, untouched). It applies the layout:

- ``shard_collection``: the embeddings are row-sharded over the rank's group
  (today's ``ShardedEmbeddingCollection`` on the group's ``DistContext``, so
  shard s of every group owns the same rows); each owner shard gets a
  cross-group step before its fused update: ``gradients`` sums the row
  gradients of every group across the replicas of the shard
  (``RowGradientSync``; each rank's embedding gradient is divided by the job's
  W, as its loss is scaled by W / B), ``average`` keeps the anchors of the
  rows it touches (``RowAverager``; divided by the group's g: each group
  trains on its own slices as a job of its own). Hot rows (``dist.hot_rows``)
  in ``gradients`` mode are elected from job-wide counts and their gradients
  all-reduced over the whole job, so every group replicates the same rows; in
  ``average`` mode each group elects its own, the owner anchors a hot row it
  owns from the replica before its first update since the last sync, and a
  sync flushes the replicas into the owners' storage, averages, and reloads
  every group's replicas from the owners;
- ``wrap_dense``: ``gradients``: DDP over the job with the hierarchical
  communication hook; ``average``: DDP inside the group and a ``DenseAverager``
  across groups;
- ``apply``: both on a run's components (``parallelize`` calls it);
- ``after_step``: ``average`` syncs rows and dense parameters every
  ``dist.sync_every`` steps; ``sync_now`` before evaluations and checkpoints;
- ``resumed_at`` after a checkpoint is loaded (checkpoints hold one replica:
  group 0's ranks write them, ``job.Job.checkpoint_writers``).

Traffic: the collections count inside-group kinds as before and cross-group
ones under ``cross/``; ``traffic`` here counts the dense part's.

>>> from tierec.config import DistConfig
>>> from tierec.distributed import DistContext
>>> from tierec.distributed.hierarchical import Hierarchical
>>> Hierarchical.build(DistContext.single(), DistConfig()) is None   # one group: today's run
True
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tierec.config import DistConfig
from tierec.distributed.codecs import codec
from tierec.distributed.context import DistContext
from tierec.distributed.dense_sync import DenseAverager, HookState, hierarchical_hook
from tierec.distributed.exchange import Traffic
from tierec.distributed.hot import HotReplica
from tierec.distributed.layout import Layout
from tierec.distributed.row_sync import RowAverager, RowGradientSync
from tierec.distributed.sharded import ShardedEmbeddingCollection
from tierec.embedding.collection import EmbeddingCollection


@dataclass
class Hierarchical:
    layout: Layout  # the job's groups and the mesh (several groups)
    cfg: DistConfig
    traffic: Traffic = field(default_factory=Traffic)  # the dense part's bytes, inside and across groups
    averagers: list[RowAverager] = field(default_factory=list)
    dense: DenseAverager | None = None
    collections: list[ShardedEmbeddingCollection] = field(default_factory=list)
    steps: int = 0
    synced_at: int = 0  # the step of the last average

    @staticmethod
    def build(ctx: DistContext, cfg: DistConfig) -> Hierarchical | None:
        """The layout of ``ctx``'s job and its training (a collective); None for a flat job."""
        layout = Layout.build(ctx, cfg.group_size)
        return None if layout.is_flat else Hierarchical(layout=layout, cfg=cfg)

    @property
    def ctx(self) -> DistContext:  # the job
        return self.layout.job

    @property
    def gradients(self) -> bool:
        return self.cfg.cross_group == "gradients"

    @property
    def group_ctx(self) -> DistContext:  # the rank's group
        return self.layout.group

    # ------------------------------------------------------------ building

    def shard_collection(self, local: EmbeddingCollection) -> ShardedEmbeddingCollection:
        coll = ShardedEmbeddingCollection(local, self.group_ctx, self.cfg)
        c = codec(self.cfg.compress)
        for shard in coll.shards:
            if self.gradients:
                shard.grad_divisor = self.ctx.world_size
                shard.cross = _GradientStep(RowGradientSync(shard.owner, c, self.layout.replica_group, coll.traffic))
                # the same hot set in every group: elected from the job's counts, summed over the job;
                # ownership (rank) stays the shard's within its group
                job_view = replace(self.group_ctx, world_size=self.ctx.world_size, sparse_group=self.ctx.sparse_group)
                shard.hot = HotReplica(shard.owner, job_view, self.cfg, coll.traffic)
            else:
                averager = RowAverager(shard.owner, c, self.layout.replica_group, coll.traffic)
                shard.cross = _AverageStep(averager)
                # hot rows (elected inside the group) change in the group's replica, not in their owner's
                # storage: the owner anchors the ones it owns from the replica before their first update
                shard.hot.before_update = _AnchorOwned(averager, shard.owner_of, self.layout.shard)
                self.averagers.append(averager)
        self.collections.append(coll)
        return coll

    def apply(self, parts: Any) -> None:
        """Shard ``parts``' embedding collections over the rank's group and wrap its dense model (in place)."""
        parts.embeddings = self.shard_collection(parts.embeddings)
        if parts.wide is not None:
            parts.wide = self.shard_collection(parts.wide)
        parts.ddp = self.wrap_dense(parts.model)

    def wrap_dense(self, model: nn.Module) -> DistributedDataParallel:
        c = codec(self.cfg.compress)
        if self.gradients:
            ddp = DistributedDataParallel(model, process_group=self.ctx.dense_group, forward_sync_buffers=False)
            ddp.register_comm_hook(HookState(hier=self.layout, codec=c, traffic=self.traffic), hierarchical_hook)
            return ddp
        ddp = DistributedDataParallel(model, process_group=self.layout.shard_group, forward_sync_buffers=False)
        self.dense = DenseAverager(list(model.parameters()), c, self.layout.replica_group, self.traffic)
        return ddp

    # ------------------------------------------------------------ the loop

    def after_step(self) -> None:
        """After the optimizer step, on every rank: ``average`` syncs every ``sync_every`` steps."""
        self.steps += 1
        self.traffic.steps += 1
        if not self.gradients and self.steps % self.cfg.sync_every == 0:
            self.sync_now()

    def sync_now(self) -> None:
        """``average``: bring the replicas together now (before an evaluation or a checkpoint)."""
        if self.gradients or self.synced_at == self.steps:
            return
        shards = [shard for coll in self.collections for shard in coll.shards]
        for shard in shards:  # 1. the owners' storage holds the hot rows' current values
            shard.hot.flush_to_owner(shard.owner_of)
        for a in self.averagers:  # 2. rows averaged across groups, in the owners' storage
            a.sync()
        for shard in shards:  # 3. every group's hot replicas read the averaged rows back
            shard.hot.reload(shard.owner_of)
        if self.dense is not None:
            self.dense.sync()
        self.synced_at = self.steps

    def resumed_at(self, step: int) -> None:
        """After loading a checkpoint (the same on every replica): the sync schedule and anchors restart from it."""
        self.steps = self.synced_at = step
        for a in self.averagers:
            a.forget()
        if self.dense is not None:
            self.dense.reanchor()

    def bytes_per_step(self) -> dict[str, float]:
        """Bytes per step this rank sent inside its group and across groups (embeddings and dense part)."""
        inside = across = 0.0
        for t in [self.traffic, *(c.traffic for c in self.collections)]:
            n = max(t.steps, 1)
            for kind, b in t.bytes_sent.items():
                if kind.startswith("cross/"):
                    across += b / n
                else:
                    inside += b / n
        return {"bytes_inside": inside, "bytes_across": across}


class _GradientStep:
    def __init__(self, sync: RowGradientSync) -> None:
        self.sync = sync

    def __call__(self, keys, tabs, rows, grad, accesses):
        return self.sync.reduce(keys, tabs, grad, accesses)


class _AverageStep:
    def __init__(self, averager: RowAverager) -> None:
        self.averager = averager

    def __call__(self, keys, tabs, rows, grad, accesses):
        self.averager.touch(keys, tabs)
        return rows, grad, accesses


class _AnchorOwned:
    """``HotReplica.before_update`` in ``average`` mode: the rows this rank owns get their anchors from the replica."""

    def __init__(self, averager: RowAverager, owner_of, shard: int) -> None:
        self.averager, self.owner_of, self.shard = averager, owner_of, shard

    def __call__(self, keys, tabs, read) -> None:
        mine = np.flatnonzero(self.owner_of(keys, tabs) == self.shard)
        if mine.size:
            self.averager.touch(keys[mine], tabs[mine], read)
