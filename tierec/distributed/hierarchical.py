"""Hierarchical training: a job's components on the ("replica", "shard") mesh (``dist.group_size``).

``Hierarchical(layout, cfg)`` runs on a job's ``layout.Layout`` of several
groups (``Hierarchical.build`` makes the layout too, and returns None for a flat
job: today's run, untouched). It applies the layout:

- ``shard_collection``: the embeddings are row-sharded over the rank's group
  (a ``ShardedEmbeddingCollection`` on ``layout.group``, so shard s of every
  group owns the same rows), made with this object's gradient reducer and
  hot-row policy (nothing is changed after construction):
  ``gradients``: ``reducers.ReplicaAllReduce`` sums the row gradients of every
  group across the replicas of the shard before the fused update (each rank's
  embedding gradient is divided by the job's W, as its loss is scaled by
  W / B); hot rows (``dist.hot_rows``) are elected from job-wide counts and
  their gradients all-reduced over the whole job, so every group replicates
  the same rows. ``average``: ``reducers.ReplicaAverage`` keeps the anchors of
  the rows each group touches (divided by the group's g: each group trains on
  its own slices as a job of its own); each group elects its own hot rows, the
  owner anchors a hot row it owns from the replica before its first update
  since the last sync, and a sync flushes the replicas into the owners'
  storage, averages, and reloads every group's replicas from the owners;
- ``wrap_dense``: ``gradients``: DDP over the job with the hierarchical
  communication hook; ``average``: DDP inside the group and a ``DenseAverager``
  across groups;
- ``parallelize.parallelize`` builds a run's components from both (and gives
  the pruner the group's collectives);
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

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tierec.config import DistConfig
from tierec.distributed.codecs import codec
from tierec.distributed.context import DistContext
from tierec.distributed.cross import CROSS
from tierec.distributed.dense_sync import DenseAverager, HookState, dense_ddp, hierarchical_hook
from tierec.distributed.exchange import Traffic
from tierec.distributed.hot import HotPolicy
from tierec.distributed.layout import Layout
from tierec.distributed.reducers import ReplicaAllReduce, ReplicaAverage
from tierec.distributed.sharded import ShardedEmbeddingCollection
from tierec.embedding.collection import EmbeddingCollection


class Hierarchical:
    def __init__(self, layout: Layout, cfg: DistConfig) -> None:
        """Training on ``layout``'s mesh of several groups with ``cfg.cross_group`` between them."""
        self.layout = layout
        self.cfg = cfg
        self.traffic = Traffic()  # the dense part's bytes, inside and across groups
        self.dense: DenseAverager | None = None
        self.collections: list[ShardedEmbeddingCollection] = []
        self.steps = 0
        self.synced_at = 0  # the step of the last average
        c = codec(cfg.compress)
        if self.gradients:  # the same hot set in every group: elected and summed over the job, owned in the group
            self.reducer: ReplicaAllReduce | ReplicaAverage = ReplicaAllReduce(c, layout.replica_group, layout.world_size)
            self.hot = HotPolicy(cfg=cfg, scope=layout.job, owner_rank=layout.shard)
        else:  # each group its own hot set, as a job of its own
            self.reducer = ReplicaAverage(c, layout.replica_group, layout.shape.group_size)
            self.hot = HotPolicy.over(cfg, layout.group)

    @staticmethod
    def build(ctx: DistContext, cfg: DistConfig) -> Hierarchical | None:
        """The layout of ``ctx``'s job and its training (a collective); None for a flat job."""
        layout = Layout.build(ctx, cfg.group_size)
        return None if layout.is_flat else Hierarchical(layout, cfg)

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
        coll = ShardedEmbeddingCollection(local, self.layout.group, self.cfg, reducer=self.reducer, hot=self.hot)
        self.collections.append(coll)
        return coll

    def wrap_dense(self, model: nn.Module) -> DistributedDataParallel:
        c = codec(self.cfg.compress)
        if self.gradients:
            ddp = dense_ddp(model, self.ctx.dense_group)
            ddp.register_comm_hook(HookState(hier=self.layout, codec=c, traffic=self.traffic), hierarchical_hook)
            return ddp
        ddp = dense_ddp(model, self.layout.shard_group)
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
        for coll in self.collections:  # 1. the owners' storage holds the hot rows' current values
            coll.flush_hot()
        self.reducer.sync()  # 2. rows averaged across groups, in the owners' storage
        for coll in self.collections:  # 3. every group's hot replicas read the averaged rows back
            coll.reload_hot()
        if self.dense is not None:
            self.dense.sync()
        self.synced_at = self.steps

    def resumed_at(self, step: int) -> None:
        """After loading a checkpoint (the same on every replica): the sync schedule and anchors restart from it."""
        self.steps = self.synced_at = step
        if not self.gradients:
            self.reducer.forget()
        if self.dense is not None:
            self.dense.reanchor()

    def bytes_per_step(self) -> dict[str, float]:
        """Bytes per step this rank sent inside its group and across groups (embeddings and dense part)."""
        inside = across = 0.0
        for t in [self.traffic, *(c.traffic for c in self.collections)]:
            n = max(t.steps, 1)
            for kind, b in t.bytes_sent.items():
                if kind.startswith(CROSS):
                    across += b / n
                else:
                    inside += b / n
        return {"bytes_inside": inside, "bytes_across": across}
