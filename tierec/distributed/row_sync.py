"""Embedding rows across groups: summed gradients (``gradients``) or averaged rows (``average``).

Both act on one owner shard (a ``TableGroup`` holding the rows this rank owns
inside its group) and talk only to the ranks that own the same shard in the
other groups (the replica group), since ownership inside a group depends only
on (table, id) and the group size.

- ``RowGradientSync.reduce``: before the fused optimizer step, the gradients
  of the rows touched in any group are summed across replicas; every replica
  then updates the union of the rows with the same sums, so the replicas stay
  identical and (uncompressed) the run equals the flat one.
- ``RowAverager``: ``touch(rows)`` before an update keeps the row's record
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
>>> rows = g.lookup(np.array([3], dtype=np.int64), np.zeros(1, dtype=np.int32), insert=True)
>>> r, s = RowGradientSync(g, codec("none"), None).reduce(rows, torch.ones(1, 2))
>>> r.tolist(), s.tolist()
([0], [[1.0, 1.0]])
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from tierec.distributed.codecs import Codec, RowResiduals, SegmentedCodec
from tierec.distributed.cross import replica_sum_rows
from tierec.distributed.exchange import Traffic
from tierec.embedding.group import TableGroup


def _keys_of(group: TableGroup, rows: Tensor) -> tuple[np.ndarray, np.ndarray]:
    r = rows.cpu().numpy()
    return group.index.row_keys[r].copy(), group.index.row_tabs[r].astype(np.int32)


def _replicas(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


class RowGradientSync:
    """``gradients`` mode for one owner shard: sum row gradients over replicas before the optimizer step."""

    def __init__(self, owner: TableGroup, c: Codec, replica_group: dist.ProcessGroup | None,
                 traffic: Traffic | None = None) -> None:
        self.owner = owner
        self.codec = c
        self.group = replica_group
        self.traffic = traffic
        self.residuals = RowResiduals(owner.dim) if c.lossy else None

    def reduce(self, rows: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        """(rows [U'], summed gradients [U', D]) over every replica's touched rows; new rows are inserted.

        ``grad`` [U, D] is this group's gradient of its distinct ``rows`` [U].
        """
        keys, tabs = _keys_of(self.owner, rows)
        ukeys, utabs, sums = replica_sum_rows(keys, tabs, grad.cpu(), self.codec, self.residuals, self.group,
                                              self.traffic, "grads")
        urows = self.owner.lookup(ukeys, utabs, insert=True)
        return urows, sums


class RowAverager:
    """``average`` mode for one owner shard: average the rows touched since the last sync across replicas."""

    def __init__(self, owner: TableGroup, c: Codec, replica_group: dist.ProcessGroup | None,
                 traffic: Traffic | None = None) -> None:
        self.owner = owner
        self.group = replica_group
        self.traffic = traffic
        self.names = sorted(owner.state)
        widths = [owner.dim] + [int(np.prod(owner.state[n].shape[1:])) for n in self.names]
        self.widths = widths  # weights, then each optimizer state, in floats per row
        self.width = sum(widths)  # floats per record: weights, then each optimizer state
        self.codec = SegmentedCodec(c, widths)
        self.residuals = RowResiduals(self.width) if c.lossy else None
        self._slot = np.full(0, -1, dtype=np.int64)  # [rows] position in the anchors, -1 = untouched
        self._rows: list[np.ndarray] = []  # touched rows, in touch order
        self._anchors: list[Tensor] = []  # their records at first touch [n, width]

    def records(self, rows: Tensor) -> Tensor:  # [U] -> [U, width]
        o, n = self.owner, rows.shape[0]
        parts = [o.weights.index_select(0, rows)]
        parts += [o.state[name].index_select(0, rows).reshape(n, w) for name, w in zip(self.names, self.widths[1:])]
        return torch.cat(parts, 1).cpu()

    def write(self, rows: Tensor, rec: Tensor) -> None:
        o = self.owner
        parts = torch.split(rec.to(o.device), self.widths, 1)
        o.weights.index_copy_(0, rows, parts[0])
        for n, p in zip(self.names, parts[1:]):
            o.state[n].index_copy_(0, rows, p.reshape(p.shape[0], *o.state[n].shape[1:]))

    @property
    def touched(self) -> int:
        return sum(r.shape[0] for r in self._rows)

    def touch(self, rows: Tensor) -> None:
        """Call with distinct owner ``rows`` [U] before they are updated: keeps the anchors of new ones."""
        r = rows.cpu().numpy()
        if r.size and int(r.max()) >= self._slot.shape[0]:
            grown = np.full(max(int(r.max()) + 1, 2 * self._slot.shape[0]), -1, dtype=np.int64)
            grown[: self._slot.shape[0]] = self._slot
            self._slot = grown
        new = r[self._slot[r] < 0]
        if new.size:
            self._slot[new] = self.touched + np.arange(new.size)
            self._rows.append(new)
            self._anchors.append(self.records(torch.from_numpy(new)))

    def forget(self) -> None:
        """Drop the anchors (after a checkpoint is loaded: its rows are every replica's last synced values)."""
        if self._rows:
            self._slot[np.concatenate(self._rows)] = -1
        self._rows, self._anchors = [], []

    def sync(self) -> int:
        """Average the touched rows across replicas; returns the rows of the union. Collective."""
        rows = torch.from_numpy(np.concatenate(self._rows)) if self._rows else torch.zeros(0, dtype=torch.int64)
        anchors = torch.cat(self._anchors) if self._anchors else torch.zeros(0, self.width)
        delta = self.records(rows) - anchors  # [T, width]
        keys, tabs = _keys_of(self.owner, rows)
        ukeys, utabs, sums = replica_sum_rows(keys, tabs, delta, self.codec, self.residuals, self.group,
                                              self.traffic, "avg")
        self.write(rows, anchors)  # every replica now holds the anchor of every row of the union
        urows = self.owner.lookup(ukeys, utabs, insert=True)
        self.write(urows, self.records(urows) + sums / _replicas(self.group))
        self._slot[rows.numpy()] = -1
        self._rows, self._anchors = [], []
        return int(urows.shape[0])
