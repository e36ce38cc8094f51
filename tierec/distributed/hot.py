"""Hot-row replication (BiPS's hotness-aware placement): job-wide hot rows live on every rank.

A ``HotReplica`` holds the hot rows of one table group, identical on every
rank. Their lookups never leave the process, their gradients are summed with
one all-reduce and every rank applies the same fused optimizer step, so the
copies stay bit-identical (a ring all-reduce hands every rank the same sums).

The hot set is refreshed every ``dist.hot_refresh_every`` steps from job-wide
counts: each rank proposes its most requested rows of the window with their counts
(one all_gather), the counts of each proposed row are summed, and the
``dist.hot_rows`` most requested become the new hot set, ties broken by
(table, id) so every rank picks the same. Only rows requested in at least
``dist.hot_min_share`` of the window's (rank, step) pairs qualify: a ring
all-reduce of a row's gradient sends about what the all-to-all path sends for
a row that every rank requests every step (id, row and gradient), and more for
a row fewer ranks request, so replication pays only for the hottest rows. The
handover is exact:

- a row that becomes hot takes its owner's current weights and optimizer
  state (the owners' contributions are summed into one buffer, zeros elsewhere);
  a row its owner does not have (a pruned row forgotten at dim 0) stays cold,
  so that it is inserted as one process would, when a batch next asks for it;
- a row that stops being hot is written back by its owner from its own replica
  copy, which is identical everywhere, so no message is needed;
- while a row is hot, its owner's copy is stale and never read; ``flush_to_owner``
  writes the replica back before a checkpoint or a pruning step, and ``reload``
  reads the owners' copies back into the replica after they changed (the
  cross-group averaging of ``dist.cross_group = "average"``, a pruning step),
  dropping the rows the owners no longer have.

The replica has the owner's row layout (``RowStorage.empty_in_memory``): whole
rows, or a pruned row's chunks with its own dims. Rows move whole
(``row_copy.RowCopy``: the record, dims included, and for pruned rows the
importance the pruner scores them by), so a pruning step on the owners
(``ShardedEmbeddingCollection.rows_at_owners``) sees every hot row as it is,
and its replicas take the owners' decision on every rank alike. The gradient
all-reduce carries the accesses of each row too when the storage counts them
(a pruned row's importance is access frequency times gradient magnitude), and
then updates only the rows some rank touched, as one process does.

>>> import numpy as np
>>> from tierec.distributed.hot import WindowCounter
>>> c = WindowCounter()
>>> c.add(np.array([5, 7, 5], dtype=np.int64), np.zeros(3, dtype=np.int32))
>>> keys, tabs, counts = c.top(1)
>>> keys.tolist(), c.counts_of(np.array([5, 9], dtype=np.int64), np.zeros(2, dtype=np.int32)).tolist()
([5], [2, 0])
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from tierec.config import DistConfig, OptimizerKind
from tierec.distributed.context import DistContext
from tierec.distributed.exchange import Traffic
from tierec.distributed.row_copy import RowCopy
from tierec.distributed import wire
from tierec.embedding.hash_index import Deduper, HashIndex
from tierec.embedding.storage import RowStorage

# (keys [U], tables [U], replica) of hot rows about to change, ``replica`` the storage holding them as they are
HotUpdateHook = Callable[[np.ndarray, np.ndarray, RowStorage], None]


class WindowCounter:
    """How often each (table, id) was requested since the last refresh."""

    def __init__(self) -> None:
        self.index = HashIndex()
        self.counts = np.zeros(self.index.row_capacity, dtype=np.int64)  # [R]
        self.steps = 0  # batches counted

    def add(self, keys: np.ndarray, tabs: np.ndarray) -> None:
        """Count one batch's (unique) pairs."""
        self.steps += 1
        rows = self.index.lookup(keys, tabs.astype(np.int32, copy=False), insert=True).rows
        if self.counts.shape[0] < self.index.row_capacity:
            grown = np.zeros(self.index.row_capacity, dtype=np.int64)
            grown[: self.counts.shape[0]] = self.counts
            self.counts = grown
        n = self.index.num_rows
        self.counts[:n] += np.bincount(rows, minlength=n)

    def top(self, k: int, least: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The (at most) k most counted (keys, tabs, counts) of the window, counted at least ``least`` times."""
        n = self.index.num_rows
        c = self.counts[:n]
        pick = np.flatnonzero(c >= least)
        if pick.size > k:
            pick = pick[np.argpartition(-c[pick], k - 1)[:k]]
        return self.index.row_keys[pick].copy(), self.index.row_tabs[pick].astype(np.int32), c[pick].copy()

    def counts_of(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:  # [N] int64, 0 when unseen
        rows = self.index.lookup(keys, tabs.astype(np.int32, copy=False), insert=False).rows
        out = np.zeros(keys.shape[0], dtype=np.int64)
        seen = rows >= 0
        out[seen] = self.counts[rows[seen]]
        return out


@dataclass(frozen=True)
class HotPolicy:
    """Which rows a sharded collection replicates: ``cfg.hot_rows`` of them, elected over ``scope``.

    ``scope`` is the ranks that elect one hot set together and sum its gradients (one all-reduce),
    ``owner_rank`` this rank's position among the owners of the rows (its rank in the ranks the rows are
    sharded over). A flat job: both the job's (``HotPolicy.over``). On a mesh in ``gradients`` mode the
    job elects and sums (every group replicates the same rows) while ownership stays the group's; in
    ``average`` mode each group elects its own (``hierarchical.Hierarchical``).
    """

    cfg: DistConfig  # hot_rows, hot_candidates, hot_min_share (hot_refresh_every: the collection's)
    scope: DistContext
    owner_rank: int

    @staticmethod
    def over(cfg: DistConfig, ctx: DistContext) -> HotPolicy:
        """Elected, summed and owned over the same ranks ``ctx``."""
        return HotPolicy(cfg=cfg, scope=ctx, owner_rank=ctx.rank)

    @property
    def enabled(self) -> bool:
        return self.cfg.hot_rows > 0

    def replica(self, owner: RowStorage, traffic: Traffic, before_update: HotUpdateHook | None = None) -> HotReplica:
        """The (empty) hot replica of one table group whose rows this rank owns in ``owner``."""
        return HotReplica(owner, self, traffic, before_update)


class HotReplica:
    """The hot rows of one table group, replicated on every rank; rows numbered 0..H-1."""

    def __init__(self, owner: RowStorage, policy: HotPolicy, traffic: Traffic,
                 before_update: HotUpdateHook | None = None) -> None:
        """``before_update(keys, tabs, replica)``: called with the replica rows an update is about to change,
        ``replica`` the storage that holds them as they are (``average`` mode anchors the rows this rank
        owns: reducers.ReplicaAverage); None when nothing needs to know."""
        self.owner = owner  # this rank's shard of the group (the rows it owns): any storage
        self.copy = RowCopy.of(owner)  # how a row moves between the owner and the replica
        self.policy = policy
        self.scope = policy.scope  # the ranks that elect and sum the hot set
        self.cfg = policy.cfg
        self.traffic = traffic
        self.before_update = before_update
        self.group = self._empty()
        self.keys = np.empty(0, dtype=np.int64)  # [H] id of each replica row
        self.tabs = np.empty(0, dtype=np.int32)  # [H] table of each replica row
        self.version = 0  # bumped by every refresh; an id split under an older set is stale
        self.counter = WindowCounter()
        self.moves = {"joined": 0, "left": 0}  # rows handed over so far, job-wide (the same on every rank)

    def _empty(self) -> RowStorage:  # the replica: the owner's row layout, in memory
        g = self.owner.empty_in_memory()
        g.step = self.owner.step
        if self.enabled and RowCopy.of(g) != self.copy:
            raise ValueError("a hot replica must hold the owner's row records (RowStorage.empty_in_memory)")
        return g

    @property
    def size(self) -> int:
        return int(self.keys.shape[0])

    @property
    def enabled(self) -> bool:
        return self.policy.enabled

    def find(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:
        """Replica row [U] of each unique (key, tab), -1 for cold ones."""
        if self.size == 0:
            return np.full(keys.shape[0], -1, dtype=np.int64)
        return self.group.lookup(keys, tabs.astype(np.int32, copy=False), insert=False).numpy()

    # ------------------------------------------------------------- training

    def backward(self, rows: np.ndarray, grad: Tensor, accesses: np.ndarray | None = None) -> None:
        """Sum the hot rows' gradients over the job and apply one identical update everywhere.

        rows [U_h] replica rows touched by this rank's batch; grad [U_h, D]; accesses [U_h]: the ids of
        the batch each served (used when the storage counts them). A row touched by any rank is updated
        (with its summed gradient and accesses), as the single process updates every row its batch
        touched. When a zero gradient leaves a row unchanged (SGD and Adagrad variants without weight
        decay) and the storage counts no accesses, every hot row is updated and no touch column is sent.
        """
        h, d = self.size, self.group.dim
        if h == 0:
            self.group.step = self.owner.step
            return
        counted = self.group.counts_accesses  # the column is each row's accesses, summed over the job
        flag = counted or self._zero_grad_moves_rows()
        buf = torch.zeros(h, d + flag)  # [H, D (+ 1)]: gradient, then a touch count (or the accesses)
        r = torch.from_numpy(rows)
        buf[r, :d] = grad
        if flag:
            buf[r, d] = torch.from_numpy(np.asarray(accesses, dtype=np.float32)) if accesses is not None else 1.0
        if self.scope.is_distributed:
            t0 = time.perf_counter()
            wire.all_reduce(buf, self.scope.sparse_group)
            w = self.scope.world_size
            self.traffic.add("hot", 2 * (w - 1) * buf.numel() * 4 // w, time.perf_counter() - t0)
        if flag:
            touched = torch.nonzero(buf[:, d] > 0).squeeze(1)
            self._before_update(touched)
            summed = buf.index_select(0, touched)
            acc = summed[:, d].numpy().copy() if counted else None
            dev = self.group.device
            self.group.update(touched.to(dev), summed[:, :d].to(dev).contiguous(), accesses=acc)
        else:
            if self.before_update is not None:  # a zero gradient leaves a row as it is: the others change
                self._before_update(torch.nonzero(buf.abs().sum(1) > 0).squeeze(1))
            self.group.update(torch.arange(h, device=self.group.device), buf.to(self.group.device))

    def _before_update(self, rows: Tensor) -> None:
        if self.before_update is not None and rows.numel():
            r = rows.numpy()
            self.before_update(self.keys[r], self.tabs[r], self.group)

    def _zero_grad_moves_rows(self) -> bool:
        """Whether a zero gradient still changes a row (Adam's moments, weight decay, 0/0 at eps 0)."""
        o = self.owner.optimizer
        return o.kind is OptimizerKind.ADAM or o.weight_decay != 0 or (o.eps == 0 and o.kind is not OptimizerKind.SGD)

    def count(self, keys: np.ndarray, tabs: np.ndarray) -> None:
        if self.enabled:
            self.counter.add(keys, tabs)

    # -------------------------------------------------------------- refresh

    def refresh(self, owner_of: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
        """Pick the new hot set from job-wide counts and hand rows over exactly (a collective)."""
        t0 = time.perf_counter()
        keys, tabs = self._elect()
        self._handover(keys, tabs, owner_of)
        self.counter = WindowCounter()
        self.version += 1
        self.traffic.add("refresh", 0, time.perf_counter() - t0)

    def _elect(self) -> tuple[np.ndarray, np.ndarray]:
        """The new hot set, the same on every rank: one all_gather of each rank's qualifying candidates.

        A row reaches ``share * W * steps`` requests only if some rank saw it at
        least ``share * steps`` times, so each rank proposes just those (at most
        ``dist.hot_candidates``, default ``dist.hot_rows``) with its counts. A
        row's job-wide count is the sum of the counts reported for it: exact for
        rows every rank proposes, an underestimate otherwise. Placement never
        changes the numbers, only where rows live, so an estimate is enough.
        """
        cfg, ctx = self.cfg, self.scope
        steps = self.counter.steps
        ck, ct, cc = self.counter.top(cfg.hot_candidates or cfg.hot_rows, max(1, math.ceil(cfg.hot_min_share * steps)))
        packed = np.stack([ck, (ct.astype(np.int64) << 32) | np.minimum(cc, 2**31 - 1)], axis=1)  # [n, 2]
        every = torch.from_numpy(packed)
        if ctx.is_distributed:  # 1. how many each rank proposes, 2. the proposals, padded to the longest
            sizes = torch.empty(ctx.world_size, dtype=torch.int64)
            wire.all_gather_single(sizes, torch.tensor([packed.shape[0]], dtype=torch.int64), ctx.sparse_group)
            m = int(sizes.max())
            mine = torch.full((m, 2), -1, dtype=torch.int64)
            mine[: packed.shape[0]] = every
            every = torch.empty(ctx.world_size * m, 2, dtype=torch.int64)
            wire.all_gather_single(every, mine, ctx.sparse_group)
            self.traffic.add("refresh", (ctx.world_size - 1) * (8 + mine.numel() * 8))
        e = every.numpy()
        e = e[e[:, 1] >= 0]
        keys, tabs, counts = np.ascontiguousarray(e[:, 0]), (e[:, 1] >> 32).astype(np.int32), e[:, 1] & 0xFFFFFFFF
        uk, ut, inv = Deduper()(keys, tabs)
        c = np.bincount(inv, weights=counts, minlength=uk.shape[0]).astype(np.int64)
        # the most requested, ties by (table, id): the same choice on every rank
        least = max(1, math.ceil(cfg.hot_min_share * ctx.world_size * steps))
        order = np.lexsort((uk, ut, -c))
        order = order[c[order] >= least][: cfg.hot_rows]
        return uk[order], ut[order]

    def _handover(self, keys: np.ndarray, tabs: np.ndarray, owner_of) -> None:
        copy = self.copy
        old_rows = self.find(keys, tabs)  # [H'] row in the old replica, -1 = joining
        # 1. rows leaving the hot set go back to their owner, from the (identical) replica
        if self.size:
            fresh = HashIndex()
            fresh.lookup(keys, tabs, insert=True)
            leaving = np.flatnonzero(fresh.lookup(self.keys, self.tabs, insert=False).rows < 0)
            self.moves["left"] += int(leaving.size)
            mine = leaving[owner_of(self.keys[leaving], self.tabs[leaving]) == self.policy.owner_rank]
            if mine.size:
                self._write_back(self.keys[mine], self.tabs[mine])
        # 2. rows joining it take their owner's weights and state: each owner sends its
        #    joining rows (in hot-set order) to everyone; every rank knows who owns what.
        joining = np.flatnonzero(old_rows < 0)
        buf = self._gather_from_owners(keys[joining], tabs[joining], owner_of)  # [J, width + 1]
        # 3. the new replica: rows 0..H'-1 in hot-set order; a row no owner has stays cold (every rank sees it)
        absent = joining[buf[:, copy.width].numpy() == 0]
        if absent.size:
            hot = np.ones(keys.shape[0], dtype=bool)
            hot[absent] = False
            keys, tabs, old_rows, buf = keys[hot], tabs[hot], old_rows[hot], buf[torch.from_numpy(hot[joining])]
            joining = np.flatnonzero(old_rows < 0)
        self.moves["joined"] += int(joining.size)
        group = self._empty()
        group.lookup(keys, tabs, insert=True)  # rows 0..H'-1
        staying = np.flatnonzero(old_rows >= 0)
        if staying.size:
            copy.write(group, keys[staying], tabs[staying], copy.read(self.group, keys[staying], tabs[staying])[1])
        if joining.size:
            copy.write(group, keys[joining], tabs[joining], buf[:, : copy.width].numpy())
        self.group, self.keys, self.tabs = group, keys.copy(), tabs.astype(np.int32)

    def _gather_from_owners(self, keys: np.ndarray, tabs: np.ndarray, owner_of) -> Tensor:
        """Rows [J, width + 1] (``RowCopy`` rows, then 1 if the owner had the row) of (keys, tabs), on every rank."""
        ctx, owner, width = self.scope, self.owner, self.copy.width
        who = owner_of(keys, tabs) if keys.size else np.empty(0, dtype=np.int32)
        per_rank = np.bincount(who, minlength=ctx.world_size)  # rows each owner sends
        m = int(per_rank.max()) if keys.size else 0
        mine = np.flatnonzero(who == self.policy.owner_rank)
        send = torch.zeros(m, width + 1)
        found, rows = self.copy.read(owner, keys[mine], tabs[mine])  # wherever they live: no lookup, no statistics
        have = np.flatnonzero(found)
        if have.size:
            send[torch.from_numpy(have), :width] = torch.from_numpy(rows[have])
            send[torch.from_numpy(have), width] = 1.0
        if not ctx.is_distributed or m == 0:
            every = send.unsqueeze(0)  # [1, m, width + 1]
        else:
            every = torch.empty(ctx.world_size * m, width + 1)
            wire.all_gather_single(every, send, ctx.sparse_group)
            self.traffic.add("refresh", (ctx.world_size - 1) * send.numel() * 4)
            every = every.view(ctx.world_size, m, width + 1)
        out = torch.zeros(keys.shape[0], width + 1)
        for r in range(every.shape[0]):
            idx = np.flatnonzero(who == r)
            if idx.size:
                out[torch.from_numpy(idx)] = every[r, : idx.size]
        return out

    def flush_to_owner(self, owner_of) -> None:
        """Write the hot rows this rank owns into its shard (before reading the shard's state, or pruning it)."""
        if self.size == 0:
            return
        mine = np.flatnonzero(owner_of(self.keys, self.tabs) == self.policy.owner_rank)
        if mine.size:
            self._write_back(self.keys[mine], self.tabs[mine])

    def reload(self, owner_of) -> None:
        """Read every hot row again from its owner (a collective), keeping the hot set and its row numbers.

        After the owners' copies changed under the replica (``average`` mode: flushed, then averaged
        across groups; a pruning step: flushed, then pruned), so that the replica holds the owners' rows
        again, with their dims. Rows the owners no longer have (a pruned row forgotten at dim 0) leave the
        hot set, on every rank alike: the next batch that asks for one inserts it at its owner.
        """
        if self.size == 0:
            return
        t0 = time.perf_counter()
        buf = self._gather_from_owners(self.keys, self.tabs, owner_of)
        present = buf[:, -1].numpy() > 0
        if not present.all():
            self.moves["left"] += int((~present).sum())
            keys, tabs = self.keys[present], self.tabs[present]
            self.group, self.keys, self.tabs = self._empty(), keys, tabs
            self.group.lookup(keys, tabs, insert=True)  # rows 0..H'-1, in the same order as before
            self.version += 1  # an id split under the old row numbers is stale
            buf = buf[torch.from_numpy(present)]
        if self.size:
            self.copy.write(self.group, self.keys, self.tabs, buf[:, :-1].numpy())
        self.traffic.add("refresh", 0, time.perf_counter() - t0)

    def _write_back(self, keys: np.ndarray, tabs: np.ndarray) -> None:
        """The replica's rows of (keys, tabs) into the owner's storage, wherever it keeps them."""
        self.copy.write(self.owner, keys, tabs, self.copy.read(self.group, keys, tabs)[1])

    def clear(self) -> None:
        """Forget the hot set (after loading a checkpoint, whose rows are all with their owners)."""
        self.group = self._empty()
        self.keys = np.empty(0, dtype=np.int64)
        self.tabs = np.empty(0, dtype=np.int32)
        self.counter = WindowCounter()
        self.version += 1
