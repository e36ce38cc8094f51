"""Embedding rows across groups: summed gradients (``gradients``) or averaged rows (``average``).

Both act on one owner shard (the ``RowStorage`` holding the rows this rank owns
inside its group: plain, tiered, pruned or both) and talk only to the ranks that own the same shard in the
other groups (the replica group), since ownership inside a group depends only
on (table, id) and the group size.

- ``RowGradientSync.reduce``: before the fused optimizer step, the gradients
  of the rows touched in any group are summed across replicas; every replica
  then updates the union of the rows with the same sums, so the replicas stay
  identical and (uncompressed) the run equals the flat one.
- ``RowAverager``: ``touch(keys, tabs)`` before an update keeps the row's record
  (weights and optimizer state) as of the last sync, its *anchor*, once per
  sync period; ``sync()`` sends each touched row's change since its anchor
  (compressed, error feedback per row), and every replica sets each row of the
  union to ``anchor + mean over replicas of the changes``. A row a replica did
  not touch holds the anchor already (the last synced value, or the
  deterministic initial value of a row nobody had), so replicas end identical.

>>> import numpy as np, torch
>>> from tierec.distributed.codecs import codec
>>> from tierec.distributed.row_sync import RowGradientSync
>>> from tierec.embedding.group import TableGroup
>>> from tierec.embedding.table import TableConfig
>>> g = TableGroup([TableConfig(name="t", dim=2, features=["f"])])
>>> keys, tabs = np.array([3], dtype=np.int64), np.zeros(1, dtype=np.int32)
>>> r, s, _ = RowGradientSync(g, codec("none"), None).reduce(keys, tabs, torch.ones(1, 2))
>>> r.tolist(), s.tolist()
([0], [[1.0, 1.0]])
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from tierec.distributed.codecs import Codec, RowResiduals, SegmentedCodec, codec
from tierec.distributed.cross import replica_sum_rows
from tierec.distributed.exchange import Traffic
from tierec.embedding.hash_index import HashIndex
from tierec.embedding.optimizers import state_shapes
from tierec.embedding.storage import RowStorage


def record_widths(owner: RowStorage) -> list[int]:
    """Floats per segment of the values of the storage's row record: the weights, then each optimizer state
    (as ``records_of``; a pruned row's record has one more column after them, its dims)."""
    shapes = state_shapes(owner.optimizer.kind, owner.dim)
    widths = [owner.dim] + [int(np.prod(s, dtype=np.int64)) for s in shapes.values()]
    if sum(widths) > owner.record_width:
        raise ValueError(f"a record of {owner.record_width} floats cannot hold {widths}")
    return widths


def _replicas(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


class RowGradientSync:
    """``gradients`` mode for one owner shard: sum row gradients over replicas before the optimizer step.

    A storage that counts accesses (pruned rows: importance by frequency) gets
    the accesses summed over the replicas too, sent uncompressed beside the
    gradient, so every replica scores (and prunes) its rows as the flat run does.
    """

    def __init__(self, owner: RowStorage, c: Codec, replica_group: dist.ProcessGroup | None,
                 traffic: Traffic | None = None) -> None:
        self.owner = owner
        self.dim = owner.dim
        self.counted = bool(owner.counts_accesses)
        self.codec = SegmentedCodec([c, codec("none")], [self.dim, 1]) if self.counted else c
        self.group = replica_group
        self.traffic = traffic
        self.residuals = RowResiduals(self.dim + self.counted) if c.lossy else None

    def reduce(self, keys: np.ndarray, tabs: np.ndarray, grad: Tensor, accesses: np.ndarray | None = None,
               ) -> tuple[Tensor, Tensor, np.ndarray | None]:
        """(rows [U'], summed gradients [U', D], summed accesses [U'] or None) over every replica's rows.

        ``grad`` [U, D] is this group's gradient of its distinct (``tabs``, ``keys``) pairs [U] (and
        ``accesses`` [U] the batch's ids each served, for storages that count them); rows touched only
        in other groups are inserted (with their deterministic initial values).
        """
        values = grad.cpu()
        if self.counted:
            acc = np.zeros(keys.shape[0], dtype=np.float32) if accesses is None else accesses
            values = torch.cat([values, torch.from_numpy(np.asarray(acc, dtype=np.float32)).unsqueeze(1)], 1)
        ukeys, utabs, sums = replica_sum_rows(keys, tabs, values, self.codec, self.residuals, self.group,
                                              self.traffic, "grads")
        urows = self.owner.lookup(ukeys, utabs, insert=True)
        if not self.counted:
            return urows, sums, None
        return urows, sums[:, : self.dim].contiguous(), sums[:, self.dim].numpy().copy()


class RowAverager:
    """``average`` mode for one owner shard: average the rows touched since the last sync across replicas.

    Rows are kept by (table, id) and read and written as whole records
    (``records_of`` / ``put_records``), so the shard may be any storage: whole
    rows (in memory or tiered) or chunked rows (pruned). Of a record only the
    values (weights, then each optimizer state) are averaged; the columns after
    them describe the row's layout (a pruned row's dims) and every replica keeps
    its own: they agree, because a pruning step happens only at a sync point and
    takes the same decision on every replica. A pruned storage's importance
    (``pruning().importance_of``: what the pruner scores rows by) is *summed*
    across replicas, uncompressed: it adds up over the batches a row served, so
    the sum is what one replica would have counted over every group's batches,
    and every replica ends with the same importance.
    """

    def __init__(self, owner: RowStorage, c: Codec, replica_group: dist.ProcessGroup | None,
                 traffic: Traffic | None = None) -> None:
        self.owner = owner
        self.group = replica_group
        self.traffic = traffic
        self.widths = record_widths(owner)  # weights, then each optimizer state, in floats per row
        self.values = sum(self.widths)  # floats averaged; the record's other columns are its layout
        self.width = owner.record_width  # floats per record
        self.importance = owner.pruning()  # None: nothing scores the rows
        self.imp_width = self.importance.importance_width if self.importance is not None else 0
        inner = [c] * len(self.widths) + ([codec("none")] if self.imp_width else [])
        self.codec = SegmentedCodec(inner, self.widths + ([self.imp_width] if self.imp_width else []))
        self.residuals = RowResiduals(self.values + self.imp_width) if c.lossy else None
        self._together = 1  # the most distinct rows the owner updated in one step so far
        self.forget()

    def records(self, keys: np.ndarray, tabs: np.ndarray, source: RowStorage | None = None) -> Tensor:  # [U, width]
        return torch.from_numpy((source or self.owner).records_of(keys, tabs)[1])

    def write(self, keys: np.ndarray, tabs: np.ndarray, rec: Tensor) -> None:
        self.owner.put_records(keys, tabs, rec.numpy())

    def scores(self, keys: np.ndarray, tabs: np.ndarray, source: RowStorage | None = None) -> Tensor:  # [U, imp_width]
        if self.importance is None:
            return torch.zeros(keys.shape[0], 0)
        scored = self.importance if source is None else source.pruning()
        return torch.from_numpy(scored.importance_of(keys, tabs)[1])

    @property
    def touched(self) -> int:
        return self._seen.num_rows

    def touch(self, keys: np.ndarray, tabs: np.ndarray, source: RowStorage | None = None) -> None:
        """Call with distinct (``tabs``, ``keys``) pairs before their rows are updated: keeps the anchors of new ones.

        ``source``: the storage that holds the rows as they are, records and importance (default the
        owner's; a hot row's are in the hot replica, of the owner's row layout, its owner's copy being stale).
        """
        if source is None:  # the owner updates these rows together: that many fit in its fast tier at once
            self._together = max(self._together, int(keys.shape[0]))
        new = self._seen.lookup(keys, tabs.astype(np.int32, copy=False), insert=True).new
        if new.size:
            k, t = keys[new].copy(), tabs[new].astype(np.int32)
            self._keys.append(k)
            self._tabs.append(t)
            self._anchors.append(self.records(k, t, source))
            self._imp_anchors.append(self.scores(k, t, source))

    def _insert(self, keys: np.ndarray, tabs: np.ndarray) -> None:
        """Insert the unknown rows of (keys, tabs) with their initial values, a step's worth of rows at a time
        (a tiered storage holds the rows of one lookup in its fast tier together)."""
        missing = np.flatnonzero(~self.owner.records_of(keys, tabs)[0])
        for lo in range(0, missing.size, self._together):
            m = missing[lo : lo + self._together]
            self.owner.lookup(keys[m], tabs[m], insert=True)

    def forget(self) -> None:
        """Drop the anchors (after a sync, or a loaded checkpoint: every replica's rows are their last synced values)."""
        self._seen = HashIndex()  # (table, id) touched since the last sync
        self._keys: list[np.ndarray] = []
        self._tabs: list[np.ndarray] = []
        self._anchors: list[Tensor] = []  # their records at first touch [n, width]
        self._imp_anchors: list[Tensor] = []  # and their importance [n, imp_width]

    def sync(self) -> int:
        """Average the touched rows across replicas; returns the rows of the union. Collective."""
        v = self.values
        keys = np.concatenate(self._keys) if self._keys else np.zeros(0, dtype=np.int64)
        tabs = np.concatenate(self._tabs) if self._tabs else np.zeros(0, dtype=np.int32)
        anchors = torch.cat(self._anchors) if self._anchors else torch.zeros(0, self.width)
        imp_anchors = torch.cat(self._imp_anchors) if self._imp_anchors else torch.zeros(0, self.imp_width)
        now = self.records(keys, tabs)  # [T, width]
        anchors[:, v:] = now[:, v:]  # the layout stays this replica's
        delta = torch.cat([now[:, :v] - anchors[:, :v], self.scores(keys, tabs) - imp_anchors], 1)  # [T, v + imp]
        ukeys, utabs, sums = replica_sum_rows(keys, tabs, delta, self.codec, self.residuals, self.group,
                                              self.traffic, "avg")
        self.write(keys, tabs, anchors)  # every replica now holds the anchor of every row of the union
        self._insert(ukeys, utabs)  # rows touched only elsewhere: their initial values
        rec = self.records(ukeys, utabs)
        rec[:, :v] += sums[:, :v] / _replicas(self.group)
        self.write(ukeys, utabs, rec)
        if self.importance is not None:  # importance adds up over every replica's batches
            self.importance.put_importance(keys, tabs, imp_anchors.numpy())
            self.importance.put_importance(ukeys, utabs, (self.scores(ukeys, utabs) + sums[:, v:]).numpy())
        self.forget()
        return int(ukeys.shape[0])
