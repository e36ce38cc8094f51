"""Hot-row replication (BiPS's hotness-aware placement): job-wide hot rows live on every rank.

A ``HotReplica`` holds the hot rows of one table group, identical on every
rank. Their lookups never leave the process, their gradients are summed with
one all-reduce and every rank applies the same fused optimizer step, so the
copies stay bit-identical (a ring all-reduce hands every rank the same sums).

The hot set is refreshed every ``dist.hot_refresh_every`` steps from job-wide
counts: each rank proposes its top-k of the window (k = ``dist.hot_candidates``),
the proposals are unioned (all_gather), their counts summed (all_reduce), and
the ``dist.hot_rows`` most requested become the new hot set, ties broken by
(table, id) so every rank picks the same. Only rows requested in at least
``dist.hot_min_share`` of the window's (rank, step) pairs qualify: a ring
all-reduce of a row's gradient sends about what the all-to-all path sends for
a row that every rank requests every step (id, row and gradient), and more for
a row fewer ranks request, so replication pays only for the hottest rows. The
handover is exact:

- a row that becomes hot takes its owner's current weights and optimizer
  state (the owners' contributions are summed into one buffer, zeros elsewhere);
- a row that stops being hot is written back by its owner from its own replica
  copy, which is identical everywhere, so no message is needed;
- while a row is hot, its owner's copy is stale and never read; ``flush_to_owner``
  writes the replica back before a checkpoint.

>>> import numpy as np
>>> from tierec.distributed.hot import WindowCounter
>>> c = WindowCounter()
>>> c.add(np.array([5, 7, 5], dtype=np.int64), np.zeros(3, dtype=np.int32))
>>> keys, tabs = c.top(1)
>>> keys.tolist(), c.counts_of(np.array([5, 9], dtype=np.int64), np.zeros(2, dtype=np.int32)).tolist()
([5], [2, 0])
"""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from tierec.config import DistConfig, OptimizerKind
from tierec.distributed.context import DistContext
from tierec.distributed.exchange import Traffic
from tierec.embedding.group import TableGroup
from tierec.embedding.hash_index import Deduper, HashIndex


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

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The (at most) k most counted (keys, tabs) of the window."""
        n = self.index.num_rows
        if n == 0 or k == 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int32)
        c = self.counts[:n]
        pick = np.argpartition(-c, k - 1)[:k] if k < n else np.arange(n)
        return self.index.row_keys[pick].copy(), self.index.row_tabs[pick].astype(np.int32)

    def counts_of(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:  # [N] int64, 0 when unseen
        rows = self.index.lookup(keys, tabs.astype(np.int32, copy=False), insert=False).rows
        out = np.zeros(keys.shape[0], dtype=np.int64)
        seen = rows >= 0
        out[seen] = self.counts[rows[seen]]
        return out


def _state_columns(group: TableGroup) -> list[tuple[str, int]]:
    """(name, columns) of each optimizer state tensor, flattened per row."""
    return [(name, int(np.prod(s.shape[1:], dtype=np.int64))) for name, s in group.state.items()]


def _read_rows(group: TableGroup, rows: Tensor) -> Tensor:  # -> [n, D + S]: weights then state
    parts = [group.weights.index_select(0, rows)]
    parts += [s.index_select(0, rows).reshape(rows.shape[0], -1) for s in group.state.values()]
    return torch.cat(parts, dim=1)


def _write_rows(group: TableGroup, rows: Tensor, values: Tensor) -> None:  # values [n, D + S]
    group.weights[rows] = values[:, : group.dim]
    col = group.dim
    for name, width in _state_columns(group):
        s = group.state[name]
        s[rows] = values[:, col : col + width].reshape(rows.shape[0], *s.shape[1:])
        col += width


class HotReplica:
    """The hot rows of one table group, replicated on every rank; rows numbered 0..H-1."""

    def __init__(self, owner: TableGroup, ctx: DistContext, cfg: DistConfig, traffic: Traffic) -> None:
        self.owner = owner  # this rank's shard of the group (the rows it owns)
        self.ctx = ctx
        self.cfg = cfg
        self.traffic = traffic
        self.group = self._empty()
        self.keys = np.empty(0, dtype=np.int64)  # [H] id of each replica row
        self.tabs = np.empty(0, dtype=np.int32)  # [H] table of each replica row
        self.version = 0  # bumped by every refresh; an id split under an older set is stale
        self.counter = WindowCounter()

    def _empty(self) -> TableGroup:
        g = TableGroup(self.owner.tables, seed=self.owner.seed, device=self.owner.device)
        g.step = self.owner.step
        return g

    @property
    def size(self) -> int:
        return int(self.keys.shape[0])

    @property
    def enabled(self) -> bool:
        return self.cfg.hot_rows > 0

    def find(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:
        """Replica row [U] of each unique (key, tab), -1 for cold ones."""
        if self.size == 0:
            return np.full(keys.shape[0], -1, dtype=np.int64)
        return self.group.index.lookup(keys, tabs.astype(np.int32, copy=False), insert=False).rows

    # ------------------------------------------------------------- training

    def backward(self, rows: np.ndarray, grad: Tensor) -> None:
        """Sum the hot rows' gradients over the job and apply one identical update everywhere.

        rows [U_h] replica rows touched by this rank's batch; grad [U_h, D].
        A row touched by any rank is updated (with its summed gradient), as the
        single process updates every row its batch touched. When a zero gradient
        leaves a row unchanged (SGD and Adagrad variants without weight decay),
        every hot row is updated and no touch column is sent.
        """
        h, d = self.size, self.group.dim
        if h == 0:
            self.group.step = self.owner.step
            return
        flag = self._zero_grad_moves_rows()
        buf = torch.zeros(h, d + flag)  # [H, D (+ 1)]: gradient, then a touch count
        r = torch.from_numpy(rows)
        buf[r, :d] = grad
        if flag:
            buf[r, d] = 1.0
        if self.ctx.is_distributed:
            t0 = time.perf_counter()
            dist.all_reduce(buf, group=self.ctx.sparse_group)
            w = self.ctx.world_size
            self.traffic.add("hot", 2 * (w - 1) * buf.numel() * 4 // w, time.perf_counter() - t0)
        if flag:
            touched = torch.nonzero(buf[:, d] > 0).squeeze(1)
            self.group.update(touched, buf.index_select(0, touched)[:, :d].contiguous())
        else:
            self.group.update(torch.arange(h), buf)

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
        cfg, ctx = self.cfg, self.ctx
        k = cfg.hot_candidates or 2 * cfg.hot_rows
        ck, ct = self.counter.top(k)
        # 1. union of every rank's candidates (fixed-size rows; table -1 pads)
        mine = torch.full((k, 2), -1, dtype=torch.int64)
        mine[: ck.shape[0], 0] = torch.from_numpy(ck)
        mine[: ck.shape[0], 1] = torch.from_numpy(ct.astype(np.int64))
        if ctx.is_distributed:
            every = torch.empty(ctx.world_size * k, 2, dtype=torch.int64)
            dist.all_gather_single(every, mine, group=ctx.sparse_group)
            self.traffic.add("refresh", (ctx.world_size - 1) * mine.numel() * 8)
        else:
            every = mine
        every = every[every[:, 1] >= 0].numpy()
        uk, ut, _ = Deduper()(np.ascontiguousarray(every[:, 0]), every[:, 1].astype(np.int32))
        # 2. their job-wide counts
        counts = torch.from_numpy(self.counter.counts_of(uk, ut))
        if ctx.is_distributed:
            dist.all_reduce(counts, group=ctx.sparse_group)
            self.traffic.add("refresh", 2 * (ctx.world_size - 1) * counts.numel() * 8 // ctx.world_size)
        c = counts.numpy()
        # 3. the most requested, ties by (table, id): the same choice on every rank
        least = max(1, math.ceil(cfg.hot_min_share * ctx.world_size * self.counter.steps))
        order = np.lexsort((uk, ut, -c))
        order = order[c[order] >= least][: cfg.hot_rows]
        return uk[order], ut[order]

    def _handover(self, keys: np.ndarray, tabs: np.ndarray, owner_of) -> None:
        ctx, owner = self.ctx, self.owner
        width = owner.dim + sum(w for _, w in _state_columns(owner))
        old_rows = self.find(keys, tabs)  # [H'] row in the old replica, -1 = joining
        # 1. rows leaving the hot set go back to their owner, from the (identical) replica
        if self.size:
            fresh = HashIndex()
            fresh.lookup(keys, tabs, insert=True)
            leaving = np.flatnonzero(fresh.lookup(self.keys, self.tabs, insert=False).rows < 0)
            mine = leaving[owner_of(self.keys[leaving], self.tabs[leaving]) == ctx.rank]
            if mine.size:
                src = torch.from_numpy(mine)
                dst = owner.lookup(self.keys[mine], self.tabs[mine], insert=True).to(owner.device)
                _write_rows(owner, dst, _read_rows(self.group, src))
        # 2. rows joining it take their owner's weights and state (one summed buffer)
        joining = np.flatnonzero(old_rows < 0)
        buf = torch.zeros(joining.size, width + 1)  # [J, D + S + 1]; last column: owner had the row
        if joining.size:
            jk, jt = keys[joining], tabs[joining]
            ours = np.flatnonzero(owner_of(jk, jt) == ctx.rank)
            rows = owner.lookup(jk[ours], jt[ours], insert=False).numpy()
            have = ours[rows >= 0]
            if have.size:
                buf[torch.from_numpy(have), :width] = _read_rows(owner, torch.from_numpy(rows[rows >= 0]))
                buf[torch.from_numpy(have), width] = 1.0
        if ctx.is_distributed and buf.numel():
            dist.all_reduce(buf, group=ctx.sparse_group)
            self.traffic.add("refresh", 2 * (ctx.world_size - 1) * buf.numel() * 4 // ctx.world_size)
        # 3. the new replica: rows 0..H'-1 in hot-set order (new rows start from the deterministic init)
        group = self._empty()
        new_rows = group.lookup(keys, tabs, insert=True)  # == arange(H')
        staying = np.flatnonzero(old_rows >= 0)
        if staying.size:
            _write_rows(group, new_rows[staying], _read_rows(self.group, torch.from_numpy(old_rows[staying])))
        present = torch.nonzero(buf[:, width] > 0).squeeze(1)
        if present.numel():
            _write_rows(group, new_rows[torch.from_numpy(joining)[present]], buf[present, :width])
        self.group, self.keys, self.tabs = group, keys.copy(), tabs.astype(np.int32)

    def flush_to_owner(self, owner_of) -> None:
        """Write the hot rows this rank owns into its shard (before reading the shard's state)."""
        if self.size == 0:
            return
        mine = np.flatnonzero(owner_of(self.keys, self.tabs) == self.ctx.rank)
        if mine.size:
            dst = self.owner.lookup(self.keys[mine], self.tabs[mine], insert=True).to(self.owner.device)
            _write_rows(self.owner, dst, _read_rows(self.group, torch.from_numpy(mine)))

    def clear(self) -> None:
        """Forget the hot set (after loading a checkpoint, whose rows are all with their owners)."""
        self.group = self._empty()
        self.keys = np.empty(0, dtype=np.int64)
        self.tabs = np.empty(0, dtype=np.int32)
        self.counter = WindowCounter()
        self.version += 1
