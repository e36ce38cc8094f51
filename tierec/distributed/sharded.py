"""ShardedEmbeddingCollection: the engine's collection with every table sharded by row.

Each (table, id) has an owner rank (``exchange.owner_of``); a rank's shard is an
ordinary ``EmbeddingCollection`` holding the rows it owns. The collection is
composed at construction from that local storage, the ranks it is sharded over
(a ``DistContext``: the layout's group, the job when flat), a gradient reducer
(``reducers``: exact, replica all-reduce, replica average) and a hot-row policy
(``hot.HotPolicy``); each table group becomes a ``group_shard.GroupShard``
whose exchange is split into named steps. Per batch and table group:

1. input distribution: dedupe the batch's (table, id) pairs locally (the
   engine's Deduper); hot ids (``HotReplica``) are served locally, the rest are
   sorted by (owner, table) and sent to their owners (all-to-all #1: counts,
   then ids); with ``dist.overlap``, :meth:`ShardedEmbeddingCollection.prepare`
   issues this for the next batch while the current one computes, and returns
   a :class:`PreparedExchange` that the caller hands to that batch's forward;
2. lookup: owners dedupe what they received and look it up (insert +
   deterministic init when training);
3. output distribution: all-to-all #2 sends the rows back, merged with the hot
   rows into the batch's unique rows;
4. the requester pools from them with the engine's fused kernel
   (``pool_forward`` over ``[U, D]`` rows, on the host) and hands the pooled
   output to the model's device (``ctx.device``; a GPU copy is non-blocking);
5. gradient distribution (backward): ``pool_backward`` gives the ``[U, D]``
   gradient, divided by the reducer's divisor (the world size W: each rank's
   loss is scaled by W so that DDP's average is the global mean); all-to-all #3
   sends it to the owners, which sum the contributions of every rank per row,
   pass them through the reducer and apply ONE fused optimizer step, as the
   single process does with the summed gradient. Hot rows' gradients go
   through one all-reduce instead.

On the same global batches, W processes (rank r taking slice r) end with the
same rows as one process, within float tolerance (tests/distributed).

>>> from tierec.batch import SparseFeatures
>>> from tierec.config import DistConfig, EmbeddingConfig
>>> from tierec.distributed import DistContext, ShardedEmbeddingCollection
>>> from tierec.embedding import tables_from_config
>>> import torch
>>> coll = ShardedEmbeddingCollection.build(tables_from_config(EmbeddingConfig(dim=4), ["a"]), ["a"],
...                                         DistContext.single(), DistConfig())
>>> sp = SparseFeatures.one_hot(("a",), torch.tensor([[1], [2]]))
>>> coll(sp, coll.prepare(sp)).shape    # prepare: the exchange started ahead, handed to this batch's forward
torch.Size([2, 1, 4])
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from tierec.batch import SparseFeatures
from tierec.config import DistConfig
from tierec.distributed.context import DistContext
from tierec.distributed.exchange import Traffic
from tierec.distributed.group_shard import GroupShard, IdRequest, Served, Sharding
from tierec.distributed.hot import HotPolicy
from tierec.distributed.reducers import ExactSum, GradientReducer
from tierec.device import resolve_device, to_device
from tierec.embedding.changes import RowChanges
from tierec.embedding.collection import EmbeddingCollection
from tierec.embedding.plan import group_inputs, select_features
from tierec.embedding.storage import RowStorage
from tierec.embedding.pool_ops import BagLayout
from tierec.embedding.pooling import backward_chunks, bag_scale, pool_backward, pool_forward
from tierec.embedding.table import TableConfig

class _ShardedPool(torch.autograd.Function):
    """Pool from the exchanged unique rows; the backward sends their gradient to the owners."""

    @staticmethod
    def forward(ctx, anchor: Tensor, shard: GroupShard, served: Served, emb: Tensor, layout: BagLayout) -> Tensor:
        out = _pool(emb, layout, len(shard.plan.features))
        ctx.args = (shard, served, layout)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # grad_out [B, F_g, D]
        shard, served, layout = ctx.args
        u = served.request.keys.shape[0]
        grad = torch.zeros(u, shard.owner.dim)  # [U, D]
        dim = shard.owner.dim
        if layout.batch:
            pool_backward(grad_out.contiguous().numpy(), layout.inverse, layout.offsets, layout.scale, layout.batch,
                          backward_chunks(dim), grad.numpy())
        if shard.grad_divisor > 1:
            grad.mul_(1.0 / shard.grad_divisor)
        shard.distribute_gradients(served, grad, np.bincount(layout.inverse, minlength=u).astype(np.float32))
        return None, None, None, None, None


def _pool(emb: Tensor, layout: BagLayout, n_features: int) -> Tensor:  # emb [U, D] -> [B, F_g, D]
    out = torch.empty(layout.batch, n_features, emb.shape[1])
    if layout.batch == 0:  # an empty slice (a global batch smaller than the job): nothing to pool
        return out
    rows = np.arange(emb.shape[0], dtype=np.int64)
    pool_forward(emb.numpy(), rows, layout.inverse, layout.offsets, layout.scale, layout.batch, out.numpy())
    return out


def _same_ids(a: SparseFeatures, b: SparseFeatures) -> bool:
    """Do ``a`` and ``b`` hold the same ids (the same object, or equal keys, sizes, values and offsets)?"""
    if a is b:
        return True
    return (a.keys == b.keys and a.batch_size == b.batch_size and torch.equal(a.offsets, b.offsets)
            and torch.equal(a.values, b.values))


@dataclass(eq=False)
class PreparedExchange:
    """One batch's id exchange, started by :meth:`ShardedEmbeddingCollection.prepare`.

    Hand it to the forward of that batch (``coll(sparse, prepared)``), once; a forward refuses it
    for another batch (other ids), from another collection, a second time, or after the forward of
    a batch prepared later (which waited it out). ``requests`` is None where nothing is exchanged
    ahead (``dist.overlap`` off, or one process): the forward does it all.
    """

    collection: ShardedEmbeddingCollection = field(repr=False)  # the collection that started it
    sparse: SparseFeatures = field(repr=False)  # the batch, as given to prepare (reselected features in the requests)
    requests: list[IdRequest] | None = field(repr=False)  # one per table group, counts (and later ids) in flight
    state: str = "posted"  # "posted" -> "used" (by its forward) or "waited out" (never used)


class ShardedEmbeddingCollection(nn.Module):
    """A drop-in for ``EmbeddingCollection`` whose rows are spread over the job's ranks."""

    def __init__(self, local: EmbeddingCollection, ctx: DistContext, cfg: DistConfig, *,
                 reducer: GradientReducer | None = None, hot: HotPolicy | None = None) -> None:
        """``local`` becomes this rank's shard: an ordinary (empty) collection that only ever
        holds the rows this rank owns; every rank must build it from the same tables and seed.

        ``ctx``: the ranks the rows are sharded over (``layout.Layout.group``: the job when flat);
        ``reducer``: what the owners do with the summed row gradients (default ``ExactSum``: the
        update); ``hot``: which rows are replicated (default: elected over ``ctx``).
        """
        super().__init__()
        if local.num_rows():
            raise ValueError("wrap an empty EmbeddingCollection: rows are placed by their owner")
        self.sharding = Sharding(ctx=ctx, cfg=cfg, reducer=reducer if reducer is not None else ExactSum(ctx.world_size),
                                 hot=hot if hot is not None else HotPolicy.over(cfg, ctx))
        self.local = local
        self.feature_names = local.feature_names
        self.tables = local.tables
        self.traffic = Traffic()
        self.shards = [GroupShard(p, self.sharding, self.traffic, counts_steps=i == 0) for i, p in enumerate(local.plans)]
        self._posted: deque[PreparedExchange] = deque()  # exchanges started and not yet used, in posting order
        self._anchor = torch.zeros((), requires_grad=True)
        self._device = resolve_device(ctx.device)  # the model's: pooled outputs go there

    @classmethod
    def build(
        cls, tables: list[TableConfig], feature_names: list[str] | tuple[str, ...], ctx: DistContext, cfg: DistConfig,
        *, seed: int = 0,
    ) -> ShardedEmbeddingCollection:
        return cls(EmbeddingCollection(tables, feature_names, seed=seed, device=ctx.device), ctx, cfg)

    @property
    def ctx(self) -> DistContext:  # the ranks the rows are sharded over
        return self.sharding.ctx

    @property
    def cfg(self) -> DistConfig:
        return self.sharding.cfg

    @property
    def groups(self) -> list[RowStorage]:
        return self.local.groups

    @property
    def dims(self) -> list[int]:
        return self.local.dims

    # ------------------------------------------------------------- forward

    def _group_keys(self, shard: GroupShard, sparse: SparseFeatures):
        if sparse.batch_size == 0:  # this rank's slice of a global batch smaller than the job
            return np.empty(0, dtype=np.int64), np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.int32)
        values, offsets, lengths = group_inputs(sparse, shard.plan.features)
        tabs = np.repeat(shard.plan.feature_table, lengths)
        return values.numpy(), offsets.numpy(), tabs

    def prepare(self, sparse: SparseFeatures) -> PreparedExchange:
        """Start exchanging the ids of a batch (step 1, all-to-all #1's counts) and return the handle
        that batch's :meth:`forward` takes. With ``dist.overlap`` on several processes the exchange
        runs while other batches compute (each later forward sends the ids of every exchange still
        posted, once their counts are in); otherwise nothing starts ahead.

        A collective: every rank prepares the same batches in the same order, and uses (or never
        uses) their handles in the same order. A forward given a handle waits out the older ones no
        forward used (they cannot be used after it); :meth:`close` waits out the rest.
        """
        reqs = None
        if self.cfg.overlap and self.ctx.is_distributed:
            chosen = sparse if sparse.keys == self.feature_names else select_features(sparse, self.feature_names)
            reqs = []
            for shard in self.shards:
                keys, _, tabs = self._group_keys(shard, chosen)
                reqs.append(shard.distribute_input(keys, tabs, async_op=True))
        prepared = PreparedExchange(self, sparse, reqs)
        self._posted.append(prepared)
        return prepared

    def _claim(self, sparse: SparseFeatures, prepared: PreparedExchange | None) -> list[IdRequest | None]:
        """The requests of ``prepared`` for this batch's forward, per table group (None: exchange now).

        Checked before any collective, so a refused handle leaves every rank where it was.
        """
        none: list[IdRequest | None] = [None] * len(self.shards)
        if prepared is None:
            return none
        if prepared.collection is not self:
            raise ValueError("this exchange was prepared by another collection; pass each collection its own")
        if prepared.state != "posted":  # used, or waited out when a later batch's exchange was used first
            raise ValueError(f"this exchange was already {prepared.state}: prepare a batch again for another forward")
        if not _same_ids(prepared.sparse, sparse):
            raise ValueError("this exchange was prepared for another batch: pass each forward the handle that "
                             "prepare() returned for its batch")
        while self._posted[0] is not prepared:  # older exchanges no forward used: done with, in posting order
            self._wait_out(self._posted.popleft())
        self._posted.popleft()
        prepared.state = "used"
        return none if prepared.requests is None else list(prepared.requests)

    def _wait_out(self, prepared: PreparedExchange) -> None:
        prepared.state = "waited out"
        for shard, r in zip(self.shards, prepared.requests or ()):
            shard.discard(r)

    def _send_posted_ids(self) -> None:
        """Put the ids of the exchanges still posted on the wire now that their counts have arrived."""
        for prepared in self._posted:
            for shard, r in zip(self.shards, prepared.requests or ()):
                shard.send_ids(r, async_op=True)

    def forward(self, sparse: SparseFeatures, prepared: PreparedExchange | None = None) -> Tensor:
        """Pooled embeddings ``[B, F, D]`` in ``feature_names`` order (all tables one dim).

        ``prepared``: what :meth:`prepare` returned for this very batch (its ids already on their
        way); the result is the same as without it. A handle of another batch is refused.
        """
        dims = set(self.dims)
        if len(dims) != 1:
            raise ValueError(f"forward() needs one dim for all tables, got {sorted(dims)}; use pooled_by_feature()")
        outs = self._forward_groups(sparse, prepared)
        plans = [s.plan for s in self.shards]
        if len(outs) == 1 and plans[0].features == tuple(range(len(self.feature_names))):
            return self._to_model(outs[0])
        order = [f for plan in plans for f in plan.features]
        perm = torch.from_numpy(np.argsort(order))
        return self._to_model(torch.cat(outs, dim=1).index_select(1, perm))

    def _to_model(self, pooled: Tensor) -> Tensor:
        """A pooled output (pooled on the host from the exchanged rows) on the model's device; its gradient
        comes back to the host for the owners."""
        return to_device(pooled, self._device)

    def pooled_by_feature(self, sparse: SparseFeatures, prepared: PreparedExchange | None = None) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for shard, pooled in zip(self.shards, self._forward_groups(sparse, prepared)):
            pooled = self._to_model(pooled)
            for i, f in enumerate(shard.plan.features):
                out[self.feature_names[f]] = pooled[:, i]
        return out

    def _forward_groups(self, sparse: SparseFeatures, prepared: PreparedExchange | None) -> list[Tensor]:
        requests = self._claim(sparse, prepared)
        if sparse.keys != self.feature_names:
            sparse = select_features(sparse, self.feature_names)
        train = self.training and torch.is_grad_enabled()
        b = sparse.batch_size
        outs = []
        for gi, shard in enumerate(self.shards):
            keys, off, tabs = self._group_keys(shard, sparse)
            req = requests[gi]
            if req is not None and req.hot_version != shard.hot.version:  # a refresh since: the split is stale
                shard.discard(req)
                req = None
            if req is None:  # 1. ids to their owners
                req = shard.distribute_input(keys, tabs, async_op=False)
            served, replies = shard.lookup(req, train=train)  # 2. the owners look them up
            cold = shard.distribute_output(served, replies)  # 3. rows back to who asked
            emb = shard.merge_hot(req, cold, train=train)  # 4. with the hot rows: the batch's unique rows
            layout = BagLayout(inverse=req.inverse, offsets=off, scale=bag_scale(off, shard.plan.mean, b), batch=b)
            if train:
                outs.append(_ShardedPool.apply(self._anchor, shard, served, emb, layout))
            else:
                outs.append(_pool(emb, layout, len(shard.plan.features)))
        self._send_posted_ids()
        return outs

    def close(self) -> None:
        """Wait out the exchanges that no forward used (every rank, at the same point, before leaving the job)."""
        while self._posted:
            self._wait_out(self._posted.popleft())

    # ------------------------------------------------------------- hot replicas

    def flush_hot(self) -> None:
        """Write the hot rows this rank owns into its shard's storage (before reading or averaging it)."""
        for shard in self.shards:
            shard.flush_hot()

    def reload_hot(self) -> None:
        """Read every hot replica back from the owners' storage (a collective, after the owners' rows changed)."""
        for shard in self.shards:
            shard.reload_hot()

    @contextmanager
    def rows_at_owners(self) -> Iterator[None]:
        """Within: every row's current values are in its owner's storage (hot rows flushed, with their
        importance when pruned), for a pruning step; after: every rank's hot replicas read the owners'
        rows back, with the dims the step chose (a collective; not after an error, which ends the job)."""
        self.flush_hot()
        yield
        self.reload_hot()

    # ------------------------------------------------------------- reports

    def table_stats(self) -> dict[str, dict[str, int]]:
        return self.local.table_stats()

    def num_rows(self) -> int:  # rows in this rank's shard (hot replicas not counted)
        return self.local.num_rows()

    def nbytes(self) -> int:  # bytes of this rank's shard plus its hot replicas
        return self.local.nbytes() + sum(s.hot.group.nbytes() for s in self.shards)

    def hot_rows(self) -> int:
        return sum(s.hot.size for s in self.shards)

    def hot_moves(self) -> dict[str, int]:
        """Rows that joined and left the hot sets so far (every handover is exact)."""
        return {k: sum(s.hot.moves[k] for s in self.shards) for k in ("joined", "left")}

    # --------------------------------------------------------------- state

    def state_meta(self) -> dict[str, Tensor]:
        """This rank's non-row state (group steps, store counters), keyed like ``EmbeddingCollection.state_meta``."""
        return self.local.state_meta()

    def iter_rows(self, chunk_bytes: int = 1 << 24):
        """This rank's rows (hot rows it owns included) in bounded chunks, like ``EmbeddingCollection.iter_rows``."""
        self.flush_hot()
        yield from self.local.iter_rows(chunk_bytes)

    def load_state_meta(self, sd: dict[str, Tensor]) -> None:
        self.local.load_state_meta(sd)
        for shard in self.shards:
            shard.hot.clear()  # loaded rows are all with their owners

    def _owned(self, table: str, ids: np.ndarray) -> np.ndarray:
        """[n] bool: which of ``table``'s ``ids`` this rank owns."""
        for shard in self.shards:
            for ti, t in enumerate(shard.owner.tables):
                if t.name == table:
                    return shard.owners.owns(ids, np.full(ids.shape[0], ti, dtype=np.int32))
        raise KeyError(f"no table {table!r} in this model")

    def load_rows(self, table: str, records: dict[str, Tensor]) -> None:
        """Load the rows of one chunk (saved on any number of ranks) that this rank owns."""
        keep = self._owned(table, records["ids"].numpy().astype(np.int64, copy=False))
        if keep.any():
            self.local.load_rows(table, _select_rows(records, keep))

    def set_weights(self, table: str, ids: np.ndarray, weights: np.ndarray) -> None:
        """What ``EmbeddingCollection.set_weights`` does, for the rows among ``ids`` that this rank owns."""
        keep = self._owned(table, ids)
        self.local.set_weights(table, ids[keep], weights[keep])

    # ------------------------------------------------- changes (delta checkpoints): this rank's shard

    def track_changes(self) -> None:
        self.local.track_changes()

    def mark_changes(self) -> None:
        self.local.mark_changes()

    def changes(self) -> list[RowChanges]:
        """This rank's rows changed and deleted since the last mark (hot rows it owns flushed first)."""
        self.flush_hot()
        return self.local.changes()

    def changed_rows(self, changes: list[RowChanges], chunk_bytes: int = 1 << 24) -> Iterator[tuple[str, dict[str, Tensor]]]:
        return self.local.changed_rows(changes, chunk_bytes)

    def deleted_ids(self, changes: list[RowChanges]) -> dict[str, Tensor]:
        return self.local.deleted_ids(changes)

    def delete_rows(self, table: str, ids: Tensor) -> None:
        """Forget the rows of ``ids`` (of any rank) that this rank owns."""
        for shard in self.shards:
            for ti, t in enumerate(shard.owner.tables):
                if t.name == table:
                    keys = ids.numpy().astype(np.int64, copy=False)
                    own = shard.owners.owns(keys, np.full(keys.shape[0], ti, dtype=np.int32))
                    self.local.delete_rows(table, ids[torch.from_numpy(own)])
                    return
        raise KeyError(f"no table {table!r} in this model")

    def catch_up(self, sd: dict[str, Tensor]) -> None:
        self.local.catch_up(sd)

    def state_dict(self, *args, **kwargs) -> dict[str, Tensor]:  # type: ignore[override]
        """This rank's rows (hot rows it owns included), keyed like ``EmbeddingCollection.state_dict``."""
        self.flush_hot()
        return self.local.state_dict()

    def load_state_dict(self, sd: dict[str, Tensor], strict: bool = True) -> None:  # type: ignore[override]
        """Load the rows of ``sd`` (any rank's shard, or a whole single-process state) that this rank owns.

        Call it once per shard of a checkpoint saved on any number of ranks.
        """
        # A table group's update count is in shard 0 only; the other shards keep the current one.
        mine: dict[str, Tensor] = {f"group{gi}.step": torch.tensor(g.step) for gi, g in enumerate(self.groups)}
        mine.update({k: v for k, v in sd.items() if k in mine})
        for shard in self.shards:
            for ti, t in enumerate(shard.owner.tables):
                prefix = f"{t.name}."
                part = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
                if "ids" not in part:
                    continue
                ids = part["ids"].numpy().astype(np.int64, copy=False)
                keep = torch.from_numpy(shard.owners.owns(ids, np.full(ids.shape[0], ti, dtype=np.int32)))
                mine.update({prefix + k: v[keep] for k, v in part.items()})
            shard.hot.clear()
        self.local.load_state_dict(mine, strict=strict)


def _select_rows(records: dict[str, Tensor], keep: np.ndarray) -> dict[str, Tensor]:
    """The records of rows ``keep`` [n] bool.

    A pruned table's ``chunked.*`` fields hold each row's values back to back, in
    proportion to its ``dims`` (values per dim: 1 for weights, 1 / chunk for importances).
    """
    k = torch.from_numpy(keep)
    out = {}
    dims = records["dims"].numpy().astype(np.int64) if "dims" in records else None
    for name, v in records.items():
        if name.startswith("chunked.") and dims is not None:
            per_dim = v.shape[0] / max(int(dims.sum()), 1)
            out[name] = v[torch.from_numpy(np.repeat(keep, (dims * per_dim).astype(np.int64)))]
        else:
            out[name] = v[k]
    return out
