"""Gradient reducers: how the owners' summed row gradients of one table group become its update.

A ``ShardedEmbeddingCollection`` is made with one ``GradientReducer``. For each
table group it asks it once, at construction, for a ``RowReduce`` bound to that
group's owner storage; the owner calls it after summing the gradients every rank
of its group sent, right before the fused optimizer step. Three reducers:

- ``ExactSum``: a flat job: the owners' sum is the update (each rank's
  gradient divided by the job's W, as its loss is scaled by W / B);
- ``ReplicaAllReduce`` (``dist.cross_group = "gradients"``): the sums are
  added across the replicas of the shard first (``row_sync.RowGradientSync``,
  compressed by ``dist.compress``), so every group updates the union of the
  rows with the same sums; divided by the job's W;
- ``ReplicaAverage`` (``dist.cross_group = "average"``): each group updates
  its own rows (divided by its g: a group trains as a job of its own) and the
  rows it touches keep their anchors (``row_sync.RowAverager``) until
  ``sync()`` averages them across groups. A hot row changes in the group's
  replica, not in its owner's storage, so its owner anchors it from the
  replica before its first update (``RowReduce.before_hot_update``).

>>> import numpy as np, torch
>>> from tierec.distributed.exchange import Ownership
>>> from tierec.distributed.reducers import ExactSum
>>> from tierec.embedding.group import TableGroup
>>> from tierec.embedding.table import TableConfig
>>> g = TableGroup([TableConfig(name="t", dim=2, features=["f"])])
>>> reduce = ExactSum(divisor=1).bind(g, Ownership(world=1, rank=0), None)
>>> rows, grad, acc = reduce(np.array([3]), np.zeros(1, dtype=np.int32), torch.tensor([0]), torch.ones(1, 2), None)
>>> rows.tolist(), grad.tolist(), reduce.before_hot_update is None
([0], [[1.0, 1.0]], True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch.distributed as dist
from torch import Tensor

from tierec.distributed.codecs import Codec
from tierec.distributed.exchange import Ownership, Traffic
from tierec.distributed.hot import HotUpdateHook
from tierec.distributed.row_sync import RowAverager, RowGradientSync
from tierec.embedding.storage import RowStorage


class RowReduce(Protocol):
    """One table group's step between the owners' summed gradients and the fused optimizer update."""

    before_hot_update: HotUpdateHook | None  # None: the hot replica's updates need nothing from this reducer

    def __call__(self, keys: np.ndarray, tabs: np.ndarray, rows: Tensor, grad: Tensor, accesses: np.ndarray | None,
                 ) -> tuple[Tensor, Tensor, np.ndarray | None]:
        """(rows [U'], gradients [U', D], accesses [U'] or None) to update, from the owner's distinct
        (``tabs``, ``keys``) pairs [U], their rows, summed gradients [U, D] and accesses."""
        ...


class GradientReducer(Protocol):
    """Makes the ``RowReduce`` of each table group of a sharded collection."""

    @property
    def divisor(self) -> int:  # each rank's row gradient is divided by this before it goes to the owners
        ...

    def bind(self, owner: RowStorage, owners: Ownership, traffic: Traffic | None) -> RowReduce:
        ...


# ------------------------------------------------------------------ the bound steps


@dataclass(frozen=True)
class _OwnersSum:
    before_hot_update = None

    def __call__(self, keys, tabs, rows, grad, accesses):
        return rows, grad, accesses


@dataclass(frozen=True)
class _SumAcross:
    sync: RowGradientSync
    before_hot_update = None

    def __call__(self, keys, tabs, rows, grad, accesses):
        return self.sync.reduce(keys, tabs, grad, accesses)


@dataclass(frozen=True)
class _AnchorOwned:
    """Before the hot replica changes rows: the ones this rank owns get their anchors from the replica."""

    averager: RowAverager
    owners: Ownership

    def __call__(self, keys: np.ndarray, tabs: np.ndarray, replica: RowStorage) -> None:
        mine = np.flatnonzero(self.owners.owns(keys, tabs))
        if mine.size:
            self.averager.touch(keys[mine], tabs[mine], replica)


@dataclass(frozen=True)
class _AverageLater:
    averager: RowAverager
    before_hot_update: HotUpdateHook

    def __call__(self, keys, tabs, rows, grad, accesses):
        self.averager.touch(keys, tabs)
        return rows, grad, accesses


# ------------------------------------------------------------------ the reducers


@dataclass(frozen=True)
class ExactSum:
    """A flat job: the owners' sum of every rank's gradient is the update."""

    divisor: int  # the job's W

    def bind(self, owner: RowStorage, owners: Ownership, traffic: Traffic | None) -> RowReduce:
        return _OwnersSum()


@dataclass(frozen=True)
class ReplicaAllReduce:
    """``gradients``: the owners' sums added across the replicas of the shard before the update."""

    codec: Codec
    replica_group: dist.ProcessGroup | None
    divisor: int  # the job's W

    def bind(self, owner: RowStorage, owners: Ownership, traffic: Traffic | None) -> RowReduce:
        return _SumAcross(RowGradientSync(owner, self.codec, self.replica_group, traffic))


@dataclass
class ReplicaAverage:
    """``average``: each group updates its own rows; ``sync()`` averages the touched rows across groups."""

    codec: Codec
    replica_group: dist.ProcessGroup | None
    divisor: int  # the group's g
    averagers: list[RowAverager] = field(default_factory=list)  # one per bound table group, in binding order

    def bind(self, owner: RowStorage, owners: Ownership, traffic: Traffic | None) -> RowReduce:
        averager = RowAverager(owner, self.codec, self.replica_group, traffic)
        self.averagers.append(averager)
        return _AverageLater(averager, _AnchorOwned(averager, owners))

    def sync(self) -> None:
        """Average every bound group's touched rows across replicas (a collective), in binding order."""
        for a in self.averagers:
            a.sync()

    def forget(self) -> None:
        """Drop the anchors (after loading a checkpoint: every replica holds the same rows)."""
        for a in self.averagers:
            a.forget()
