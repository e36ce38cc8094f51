"""ShardedEmbeddingCollection: the engine's collection with every table sharded by row.

Each (table, id) has an owner rank (``exchange.owner_of``); a rank's shard is an
ordinary ``EmbeddingCollection`` holding the rows it owns. Per batch and table
group:

1. dedupe the batch's (table, id) pairs locally (the engine's Deduper); hot ids
   (``HotReplica``) are served locally, the rest are sorted by (owner, table);
2. all-to-all #1: per-(owner, table) counts, then the ids (``all_to_all_single``
   with split sizes); with ``dist.overlap`` this is issued for the next batch
   while the current one computes;
3. owners dedupe what they received, look it up (insert + deterministic init
   when training) and all-to-all #2 sends the rows back;
4. the requester pools from the received rows with the engine's fused kernel
   (``pool_forward`` over ``[U, D]`` rows);
5. backward: ``pool_backward`` gives the ``[U, D]`` gradient, divided by the
   world size W (each rank's loss is scaled by W so that DDP's average is the
   global mean); all-to-all #3 sends it to the owners, which sum the
   contributions of every rank per row and apply ONE fused optimizer step, as
   the single process does with the summed gradient. Hot rows' gradients go
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
>>> coll(SparseFeatures.one_hot(("a",), torch.tensor([[1], [2]]))).shape
torch.Size([2, 1, 4])
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from tierec.batch import SparseFeatures
from tierec.config import DistConfig
from tierec.distributed.context import DistContext
from tierec.distributed.exchange import Exchange, Traffic, all_to_all, off_rank_bytes, owner_of
from tierec.distributed.hot import HotReplica
from tierec.embedding.collection import EmbeddingCollection
from tierec.embedding.plan import GroupPlan, group_inputs, select_features
from tierec.embedding.storage import RowStorage
from tierec.embedding.hash_index import Deduper
from tierec.embedding.pool_ops import BagLayout
from tierec.embedding.pooling import backward_chunks, bag_scale, pool_backward, pool_forward
from tierec.embedding.table import TableConfig

_ID_BYTES = 8  # int64


@dataclass
class _IdRequest:
    """One table group's ids of one batch, on their way to their owners (all-to-all #1)."""

    keys: np.ndarray  # [U] unique keys (all occurrences when dedupe is off)
    tabs: np.ndarray  # [U] int32 table within the group
    inverse: np.ndarray  # [N] occurrence -> position in keys
    hot_pos: np.ndarray  # [U_h] positions of hot ids
    hot_rows: np.ndarray  # [U_h] their replica rows
    cold_pos: np.ndarray  # [U_c] positions of cold ids, sorted by (owner, table)
    send_splits: list[int]  # [W] ids for each owner
    hot_version: int
    counts: Exchange  # [W, T] -> the counts every rank sends here
    ids: Exchange | None = None  # cold keys -> the keys this rank owns, by source rank
    recv_counts: np.ndarray | None = None  # [W, T]


@dataclass
class _Served:
    """What the owner side of one step remembers for the backward."""

    request: _IdRequest
    recv_splits: list[int]  # [W] ids received from each rank
    owner_rows: Tensor  # [U_o] rows of the distinct received pairs in this rank's shard
    owner_inverse: Tensor  # [M] received id -> position in owner_rows
    owner_keys: np.ndarray  # [U_o] their (table, id) pairs: ids ...
    owner_tabs: np.ndarray  # [U_o] ... and tables within the group


class _GroupShard:
    """The sharded exchange of one table group: owner shard, hot replica, traffic counters."""

    def __init__(self, plan: GroupPlan, ctx: DistContext, cfg: DistConfig, traffic: Traffic, *, counts_steps: bool) -> None:
        self.plan = plan
        self.owner: RowStorage = plan.group
        self.n_tables = len(self.owner.tables)
        self.ctx = ctx
        self.cfg = cfg
        self.traffic = traffic
        self.hot = HotReplica(self.owner, ctx, cfg, traffic)
        self._dedupe = Deduper()
        self.steps = 0  # training steps this group has taken (drives the hot refresh)
        self.counts_steps = counts_steps  # this group advances traffic.steps
        self.grad_divisor = ctx.world_size  # each rank's loss is scaled by W / B (hierarchical: the job's W)
        # Hierarchical training (tierec/distributed/hierarchical.py): called before the fused step with the
        # owner's (keys, tables, rows, summed gradients, accesses or None); returns the rows, gradients and
        # accesses to update (rows touched in other groups included).
        self.cross: Callable[..., tuple[Tensor, Tensor, np.ndarray | None]] | None = None

    def owner_of(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:
        return owner_of(keys, tabs, self.ctx.world_size)

    # -------------------------------------------------- 1.+2. ids to owners

    def request(self, keys: np.ndarray, tabs: np.ndarray, *, async_op: bool) -> _IdRequest:
        """Dedupe, split hot / cold, and start all-to-all #1 (the counts)."""
        ctx, w, t = self.ctx, self.ctx.world_size, self.n_tables
        if self.cfg.dedupe:
            ukeys, utabs, inverse = self._dedupe(keys, tabs)
        else:  # the naive baseline: one request per occurrence
            ukeys, utabs, inverse = keys, tabs.astype(np.int32), np.arange(keys.shape[0], dtype=np.int64)
        hot_rows = self.hot.find(ukeys, utabs)
        is_hot = hot_rows >= 0
        hot_pos, cold = np.flatnonzero(is_hot), np.flatnonzero(~is_hot)
        owners = self.owner_of(ukeys[cold], utabs[cold])
        order = np.lexsort((utabs[cold], owners))
        cold_pos = cold[order]
        counts = np.bincount(owners.astype(np.int64) * t + utabs[cold], minlength=w * t).reshape(w, t)
        send_splits = counts.sum(1).tolist()
        sent = torch.from_numpy(counts.astype(np.int64))  # [W, T]
        t0 = time.perf_counter()
        x = all_to_all(sent, [1] * w, [1] * w, ctx.sparse_group, async_op=async_op)
        self.traffic.add("counts", (w - 1) * t * 8)
        self.traffic.add("ids", seconds=time.perf_counter() - t0)
        return _IdRequest(
            keys=ukeys, tabs=utabs, inverse=inverse, hot_pos=hot_pos, hot_rows=hot_rows[hot_pos], cold_pos=cold_pos,
            send_splits=send_splits, hot_version=self.hot.version, counts=x,
        )

    def send_ids(self, req: _IdRequest, *, async_op: bool) -> None:
        """Wait for the counts, start the ids' all-to-all."""
        if req.ids is not None:
            return
        req.recv_counts = req.counts.wait(self.traffic, "ids").numpy()
        recv_splits = req.recv_counts.sum(1).tolist()
        cold_keys = torch.from_numpy(req.keys[req.cold_pos])
        t0 = time.perf_counter()
        req.ids = all_to_all(cold_keys, req.send_splits, recv_splits, self.ctx.sparse_group, async_op=async_op)
        self.traffic.add("ids", off_rank_bytes(req.send_splits, self.ctx.rank, _ID_BYTES), time.perf_counter() - t0)

    # --------------------------------------------------- 3. owners reply rows

    def serve(self, req: _IdRequest, *, train: bool) -> tuple[_Served, Tensor]:
        """Owner lookups and all-to-all #2; returns the step record and the unique rows [U, D]."""
        self.send_ids(req, async_op=False)
        recv_keys = req.ids.wait(self.traffic, "ids").numpy()  # [M]
        recv_counts = req.recv_counts
        w, t, d = self.ctx.world_size, self.n_tables, self.owner.dim
        recv_tabs = np.repeat(np.tile(np.arange(t, dtype=np.int32), w), recv_counts.reshape(-1))  # [M]
        okeys, otabs, oinv = self._dedupe(recv_keys, recv_tabs)
        orows = self.owner.lookup(okeys, otabs, insert=train)  # [U_o]
        vals = self.owner.gather(orows.numpy()).cpu()  # [U_o, D]; unknown ids at evaluation read as zeros
        oinv_t = torch.from_numpy(oinv)
        recv_splits = recv_counts.sum(1).tolist()
        t0 = time.perf_counter()
        rows = all_to_all(vals.index_select(0, oinv_t), recv_splits, req.send_splits, self.ctx.sparse_group).out
        self.traffic.add("rows", off_rank_bytes(recv_splits, self.ctx.rank, d * 4), time.perf_counter() - t0)
        emb = torch.empty(req.keys.shape[0], d)  # [U, D]
        emb[torch.from_numpy(req.cold_pos)] = rows
        if req.hot_pos.size:
            emb[torch.from_numpy(req.hot_pos)] = self.hot.group.gather(req.hot_rows).cpu()
        if train:
            self.hot.count(req.keys, req.tabs)
        return _Served(req, recv_splits, orows, oinv_t, okeys, otabs), emb

    # ------------------------------------------------ 5. gradients to owners

    def backward(self, served: _Served, grad: Tensor, accesses: np.ndarray) -> None:
        """grad [U, D] already divided by W; accesses [U]: the batch's ids each unique row served."""
        req, d = served.request, self.owner.dim
        t0 = time.perf_counter()
        cold = grad.index_select(0, torch.from_numpy(req.cold_pos))  # [U_c, D]
        counted = self.owner.counts_accesses  # the storage wants each row's accesses too: one more column
        if counted:
            cold = torch.cat([cold, torch.from_numpy(accesses[req.cold_pos]).unsqueeze(1)], 1)  # [U_c, D + 1]
        width = cold.shape[1]
        recv = all_to_all(cold, req.send_splits, served.recv_splits, self.ctx.sparse_group).out  # [M, width]
        self.traffic.add("grads", off_rank_bytes(req.send_splits, self.ctx.rank, width * 4), time.perf_counter() - t0)
        summed = torch.zeros(served.owner_rows.shape[0], width).index_add_(0, served.owner_inverse, recv)  # [U_o, width]
        acc = summed[:, d].numpy().copy() if counted else None
        rows, summed = served.owner_rows, summed[:, :d].contiguous()  # [U_o, D]
        if self.cross is not None:  # hierarchical training: across the replicas of this shard first
            rows, summed, acc = self.cross(served.owner_keys, served.owner_tabs, rows, summed, acc)
        self.owner.update(rows.to(self.owner.device), summed.to(self.owner.device), accesses=acc)
        self.hot.backward(req.hot_rows, grad.index_select(0, torch.from_numpy(req.hot_pos)))
        self.steps += 1
        if self.counts_steps:  # one step per collection, not per group
            self.traffic.steps += 1
        if self.hot.enabled and self.steps % self.cfg.hot_refresh_every == 0:
            self.hot.refresh(self.owner_of)


class _ShardedPool(torch.autograd.Function):
    """Pool from the exchanged unique rows; the backward sends their gradient to the owners."""

    @staticmethod
    def forward(ctx, anchor: Tensor, shard: _GroupShard, served: _Served, emb: Tensor, layout: BagLayout) -> Tensor:
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
        shard.backward(served, grad, np.bincount(layout.inverse, minlength=u).astype(np.float32))
        return None, None, None, None, None


def _pool(emb: Tensor, layout: BagLayout, n_features: int) -> Tensor:  # emb [U, D] -> [B, F_g, D]
    out = torch.empty(layout.batch, n_features, emb.shape[1])
    if layout.batch == 0:  # an empty slice (a global batch smaller than the job): nothing to pool
        return out
    rows = np.arange(emb.shape[0], dtype=np.int64)
    pool_forward(emb.numpy(), rows, layout.inverse, layout.offsets, layout.scale, layout.batch, out.numpy())
    return out


@dataclass
class _Pending:
    values: Tensor  # the batch's id tensor: a prefetch is matched to its batch by identity
    offsets: Tensor
    requests: list[_IdRequest]


class ShardedEmbeddingCollection(nn.Module):
    """A drop-in for ``EmbeddingCollection`` whose rows are spread over the job's ranks."""

    def __init__(self, local: EmbeddingCollection, ctx: DistContext, cfg: DistConfig) -> None:
        """``local`` becomes this rank's shard: an ordinary (empty) collection that only ever
        holds the rows this rank owns; every rank must build it from the same tables and seed."""
        super().__init__()
        if local.num_rows():
            raise ValueError("wrap an empty EmbeddingCollection: rows are placed by their owner")
        self.ctx = ctx
        self.cfg = cfg
        self.local = local
        self.feature_names = local.feature_names
        self.tables = local.tables
        self.traffic = Traffic()
        self.shards = [_GroupShard(p, ctx, cfg, self.traffic, counts_steps=i == 0) for i, p in enumerate(self.local.plans)]
        self._pending: deque[_Pending] = deque()
        self._anchor = torch.zeros((), requires_grad=True)

    @classmethod
    def build(
        cls, tables: list[TableConfig], feature_names: list[str] | tuple[str, ...], ctx: DistContext, cfg: DistConfig,
        *, seed: int = 0,
    ) -> ShardedEmbeddingCollection:
        return cls(EmbeddingCollection(tables, feature_names, seed=seed, device=ctx.device), ctx, cfg)

    @property
    def groups(self) -> list[RowStorage]:
        return self.local.groups

    @property
    def dims(self) -> list[int]:
        return self.local.dims

    # ------------------------------------------------------------- forward

    def _group_keys(self, shard: _GroupShard, sparse: SparseFeatures):
        if sparse.batch_size == 0:  # this rank's slice of a global batch smaller than the job
            return np.empty(0, dtype=np.int64), np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.int32)
        values, offsets, lengths = group_inputs(sparse, shard.plan.features)
        tabs = np.repeat(shard.plan.feature_table, lengths)
        return values.numpy(), offsets.numpy(), tabs

    def prefetch(self, sparse: SparseFeatures) -> None:
        """Start exchanging the ids of a batch that a later ``forward`` will get (no-op without overlap).

        Must be called in the same order on every rank, like every collective.
        """
        if not (self.cfg.overlap and self.ctx.is_distributed):
            return
        if sparse.keys != self.feature_names:
            sparse = select_features(sparse, self.feature_names)
        reqs = []
        for shard in self.shards:
            keys, _, tabs = self._group_keys(shard, sparse)
            reqs.append(shard.request(keys, tabs, async_op=True))
        self._pending.append(_Pending(sparse.values, sparse.offsets, reqs))

    def _take_pending(self, sparse: SparseFeatures) -> list[_IdRequest] | None:
        """The prefetched requests of this batch; older prefetches that were never used are dropped."""
        while self._pending:
            p = self._pending[0]
            if p.values is sparse.values and p.offsets is sparse.offsets:
                self._pending.popleft()
                return p.requests
            if not any(q.values is sparse.values for q in self._pending):
                return None  # this batch was not prefetched; keep the queue for later batches
            self._discard(self._pending.popleft())
        return None

    def _discard(self, p: _Pending) -> None:
        for shard, r in zip(self.shards, p.requests):
            (r.ids or r.counts).wait(self.traffic, "ids")

    def _advance_pending(self) -> None:
        """Put the next prefetched batch's ids on the wire now that their counts have arrived."""
        for p in self._pending:
            for shard, r in zip(self.shards, p.requests):
                shard.send_ids(r, async_op=True)

    def forward(self, sparse: SparseFeatures) -> Tensor:
        """Pooled embeddings ``[B, F, D]`` in ``feature_names`` order (all tables one dim)."""
        dims = set(self.dims)
        if len(dims) != 1:
            raise ValueError(f"forward() needs one dim for all tables, got {sorted(dims)}; use pooled_by_feature()")
        outs = self._forward_groups(sparse)
        plans = [s.plan for s in self.shards]
        if len(outs) == 1 and plans[0].features == tuple(range(len(self.feature_names))):
            return outs[0]
        order = [f for plan in plans for f in plan.features]
        perm = torch.from_numpy(np.argsort(order))
        return torch.cat(outs, dim=1).index_select(1, perm)

    def pooled_by_feature(self, sparse: SparseFeatures) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for shard, pooled in zip(self.shards, self._forward_groups(sparse)):
            for i, f in enumerate(shard.plan.features):
                out[self.feature_names[f]] = pooled[:, i]
        return out

    def _forward_groups(self, sparse: SparseFeatures) -> list[Tensor]:
        prefetched = self._take_pending(sparse)
        if sparse.keys != self.feature_names:
            sparse = select_features(sparse, self.feature_names)
        train = self.training and torch.is_grad_enabled()
        b = sparse.batch_size
        outs = []
        for gi, shard in enumerate(self.shards):
            keys, off, tabs = self._group_keys(shard, sparse)
            req = prefetched[gi] if prefetched is not None else None
            if req is not None and req.hot_version != shard.hot.version:  # a refresh since: the split is stale
                (req.ids or req.counts).wait(self.traffic, "ids")
                req = None
            if req is None:
                req = shard.request(keys, tabs, async_op=False)
            served, emb = shard.serve(req, train=train)
            layout = BagLayout(inverse=req.inverse, offsets=off, scale=bag_scale(off, shard.plan.mean, b), batch=b)
            if train:
                outs.append(_ShardedPool.apply(self._anchor, shard, served, emb, layout))
            else:
                outs.append(_pool(emb, layout, len(shard.plan.features)))
        self._advance_pending()
        return outs

    def close(self) -> None:
        """Wait out prefetches that no forward will use (call before leaving the job)."""
        while self._pending:
            self._discard(self._pending.popleft())

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
        for shard in self.shards:
            shard.hot.flush_to_owner(shard.owner_of)
        yield from self.local.iter_rows(chunk_bytes)

    def load_state_meta(self, sd: dict[str, Tensor]) -> None:
        self.local.load_state_meta(sd)
        for shard in self.shards:
            shard.hot.clear()  # loaded rows are all with their owners

    def load_rows(self, table: str, records: dict[str, Tensor]) -> None:
        """Load the rows of one chunk (saved on any number of ranks) that this rank owns."""
        for shard in self.shards:
            for ti, t in enumerate(shard.owner.tables):
                if t.name != table:
                    continue
                ids = records["ids"].numpy().astype(np.int64, copy=False)
                keep = shard.owner_of(ids, np.full(ids.shape[0], ti, dtype=np.int32)) == self.ctx.rank
                if keep.any():
                    self.local.load_rows(table, _select_rows(records, keep))
                return
        raise KeyError(f"no table {table!r} in this model")

    def state_dict(self, *args, **kwargs) -> dict[str, Tensor]:  # type: ignore[override]
        """This rank's rows (hot rows it owns included), keyed like ``EmbeddingCollection.state_dict``."""
        for shard in self.shards:
            shard.hot.flush_to_owner(shard.owner_of)
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
                keep = torch.from_numpy(shard.owner_of(ids, np.full(ids.shape[0], ti, dtype=np.int32)) == self.ctx.rank)
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
