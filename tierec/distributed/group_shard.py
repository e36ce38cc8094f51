"""GroupShard: one table group of a sharded collection, its exchange split into named steps.

A ``GroupShard`` is made from the group's plan (its owner storage: the rows
this rank owns), a ``Sharding`` (the ranks the rows are sharded over, the
config, the gradient reducer and the hot-row policy) and a traffic counter.
It builds its own parts from them once, at construction: its ``RowReduce``
(``reducers``) and its ``HotReplica`` (``hot``); nothing changes them later.
Per batch, in order:

1. ``distribute_input``: dedupe the (table, id) pairs, split hot from cold
   ones, sort the cold ones by (owner, table) and start all-to-all #1 (the
   per-(owner, table) counts); ``send_ids`` then sends the ids themselves
   (with ``dist.overlap`` both run a batch ahead);
2. ``lookup``: the owner side: dedupe the received ids and look them up in
   the owner storage (insert + deterministic init when training);
3. ``distribute_output``: all-to-all #2 sends the rows back to the ranks that
   asked for them;
4. ``merge_hot``: the batch's unique rows ``[U, D]``: the cold ones received,
   the hot ones from the local replica;
5. ``distribute_gradients`` (backward): all-to-all #3 sends each row's
   gradient to its owner, which sums the contributions, hands them to the
   reducer and applies one fused optimizer step; hot rows' gradients go
   through the replica's all-reduce.

>>> from tierec.config import DistConfig
>>> from tierec.distributed.context import DistContext
>>> from tierec.distributed.group_shard import Sharding
>>> s = Sharding.flat(DistContext.single(), DistConfig())
>>> s.reducer.divisor, s.hot.enabled, s.owners.world
(1, False, 1)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tierec.config import DistConfig
from tierec.distributed.context import DistContext
from tierec.distributed.exchange import Ownership, Traffic, off_rank_bytes
from tierec.distributed.wire import Exchange, all_to_all
from tierec.distributed.hot import HotPolicy
from tierec.distributed.reducers import ExactSum, GradientReducer
from tierec.embedding.hash_index import Deduper
from tierec.embedding.plan import GroupPlan
from tierec.embedding.storage import RowStorage

_ID_BYTES = 8  # int64


@dataclass(frozen=True)
class Sharding:
    """How a collection's rows are spread: over which ranks, with which reducer and hot-row policy."""

    ctx: DistContext  # the ranks the rows are sharded over (the layout's group; the job when flat)
    cfg: DistConfig  # dedupe, overlap, hot_refresh_every
    reducer: GradientReducer
    hot: HotPolicy

    @staticmethod
    def flat(ctx: DistContext, cfg: DistConfig) -> Sharding:
        """Sharded over the ranks of ``ctx`` and nothing else: owners sum, hot rows elected over ``ctx``."""
        return Sharding(ctx=ctx, cfg=cfg, reducer=ExactSum(divisor=ctx.world_size), hot=HotPolicy.over(cfg, ctx))

    @property
    def owners(self) -> Ownership:
        return Ownership(world=self.ctx.world_size, rank=self.ctx.rank)


@dataclass
class IdRequest:
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
class Served:
    """What the owner side of one step remembers for the backward."""

    request: IdRequest
    recv_splits: list[int]  # [W] ids received from each rank
    owner_rows: Tensor  # [U_o] rows of the distinct received pairs in this rank's shard
    owner_inverse: Tensor  # [M] received id -> position in owner_rows
    owner_keys: np.ndarray  # [U_o] their (table, id) pairs: ids ...
    owner_tabs: np.ndarray  # [U_o] ... and tables within the group


class GroupShard:
    """The sharded exchange of one table group: owner shard, gradient reducer, hot replica, traffic counters."""

    def __init__(self, plan: GroupPlan, sharding: Sharding, traffic: Traffic, *, counts_steps: bool) -> None:
        self.plan = plan
        self.owner: RowStorage = plan.group
        self.n_tables = len(self.owner.tables)
        self.ctx = sharding.ctx
        self.cfg = sharding.cfg
        self.owners = sharding.owners
        self.traffic = traffic
        self.reduce = sharding.reducer.bind(self.owner, self.owners, traffic)
        self.grad_divisor = sharding.reducer.divisor  # each rank's loss is scaled by divisor / B
        self.hot = sharding.hot.replica(self.owner, traffic, self.reduce.before_hot_update)
        self._dedupe = Deduper()
        self.steps = 0  # training steps this group has taken (drives the hot refresh)
        self.counts_steps = counts_steps  # this group advances traffic.steps

    def owner_of(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:
        return self.owners.owner_of(keys, tabs)

    # -------------------------------------------------- 1. input distribution: ids to owners

    def distribute_input(self, keys: np.ndarray, tabs: np.ndarray, *, async_op: bool) -> IdRequest:
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
        return IdRequest(
            keys=ukeys, tabs=utabs, inverse=inverse, hot_pos=hot_pos, hot_rows=hot_rows[hot_pos], cold_pos=cold_pos,
            send_splits=send_splits, hot_version=self.hot.version, counts=x,
        )

    def send_ids(self, req: IdRequest, *, async_op: bool) -> None:
        """Wait for the counts, start the ids' all-to-all."""
        if req.ids is not None:
            return
        req.recv_counts = req.counts.wait(self.traffic, "ids").numpy()
        recv_splits = req.recv_counts.sum(1).tolist()
        cold_keys = torch.from_numpy(req.keys[req.cold_pos])
        t0 = time.perf_counter()
        req.ids = all_to_all(cold_keys, req.send_splits, recv_splits, self.ctx.sparse_group, async_op=async_op)
        self.traffic.add("ids", off_rank_bytes(req.send_splits, self.ctx.rank, _ID_BYTES), time.perf_counter() - t0)

    def discard(self, req: IdRequest) -> None:
        """Wait out a request no forward will use (its exchange may be in flight)."""
        (req.ids or req.counts).wait(self.traffic, "ids")

    # --------------------------------------------------- 2. lookup, on the owner

    def lookup(self, req: IdRequest, *, train: bool) -> tuple[Served, Tensor]:
        """The rows [M, D] of the ids every rank sent here, in the order received, and the owner's record."""
        self.send_ids(req, async_op=False)
        recv_keys = req.ids.wait(self.traffic, "ids").numpy()  # [M]
        recv_counts = req.recv_counts
        w, t = self.ctx.world_size, self.n_tables
        recv_tabs = np.repeat(np.tile(np.arange(t, dtype=np.int32), w), recv_counts.reshape(-1))  # [M]
        okeys, otabs, oinv = self._dedupe(recv_keys, recv_tabs)
        orows = self.owner.lookup(okeys, otabs, insert=train)  # [U_o]
        vals = self.owner.gather(orows.numpy()).cpu()  # [U_o, D]; unknown ids at evaluation read as zeros
        oinv_t = torch.from_numpy(oinv)
        served = Served(req, recv_counts.sum(1).tolist(), orows, oinv_t, okeys, otabs)
        return served, vals.index_select(0, oinv_t)

    # --------------------------------------------------- 3. output distribution: rows back

    def distribute_output(self, served: Served, replies: Tensor) -> Tensor:
        """All-to-all #2: ``replies`` [M, D] to the ranks that asked; returns this rank's cold rows [U_c, D]."""
        req = served.request
        t0 = time.perf_counter()
        rows = all_to_all(replies, served.recv_splits, req.send_splits, self.ctx.row_group).out
        nbytes = off_rank_bytes(served.recv_splits, self.ctx.rank, self.owner.dim * 4)
        self.traffic.add("rows", nbytes, time.perf_counter() - t0)
        return rows

    # --------------------------------------------------- 4. the batch's unique rows

    def merge_hot(self, req: IdRequest, cold_rows: Tensor, *, train: bool) -> Tensor:
        """The unique rows [U, D] of the request: the cold ones received, the hot ones from the replica."""
        emb = torch.empty(req.keys.shape[0], self.owner.dim)  # [U, D]
        emb[torch.from_numpy(req.cold_pos)] = cold_rows
        if req.hot_pos.size:
            emb[torch.from_numpy(req.hot_pos)] = self.hot.group.gather(req.hot_rows).cpu()
        if train:
            self.hot.count(req.keys, req.tabs)
        return emb

    # ------------------------------------------------ 5. gradient distribution: gradients to owners

    def distribute_gradients(self, served: Served, grad: Tensor, accesses: np.ndarray) -> None:
        """grad [U, D] already divided by ``grad_divisor``; accesses [U]: the batch's ids each unique row served."""
        req, d = served.request, self.owner.dim
        t0 = time.perf_counter()
        cold = grad.index_select(0, torch.from_numpy(req.cold_pos))  # [U_c, D]
        counted = self.owner.counts_accesses  # the storage wants each row's accesses too: one more column
        if counted:
            cold = torch.cat([cold, torch.from_numpy(accesses[req.cold_pos]).unsqueeze(1)], 1)  # [U_c, D + 1]
        width = cold.shape[1]
        recv = all_to_all(cold, req.send_splits, served.recv_splits, self.ctx.row_group).out  # [M, width]
        self.traffic.add("grads", off_rank_bytes(req.send_splits, self.ctx.rank, width * 4), time.perf_counter() - t0)
        summed = torch.zeros(served.owner_rows.shape[0], width).index_add_(0, served.owner_inverse, recv)  # [U_o, width]
        acc = summed[:, d].numpy().copy() if counted else None
        rows, summed = served.owner_rows, summed[:, :d].contiguous()  # [U_o, D]
        rows, summed, acc = self.reduce(served.owner_keys, served.owner_tabs, rows, summed, acc)
        self.owner.update(rows.to(self.owner.device), summed.to(self.owner.device), accesses=acc)
        self.hot.backward(req.hot_rows, grad.index_select(0, torch.from_numpy(req.hot_pos)), accesses[req.hot_pos])
        self.steps += 1
        if self.counts_steps:  # one step per collection, not per group
            self.traffic.steps += 1
        if self.hot.enabled and self.steps % self.cfg.hot_refresh_every == 0:
            self.hot.refresh(self.owner_of)

    # ------------------------------------------------ the hot replica around the owner's storage

    def flush_hot(self) -> None:
        """The hot rows this rank owns written into its storage (before reading or averaging it)."""
        self.hot.flush_to_owner(self.owner_of)

    def reload_hot(self) -> None:
        """The hot replica read back from the owners' storage (a collective, after it changed)."""
        self.hot.reload(self.owner_of)
