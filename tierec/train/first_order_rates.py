"""First-order weights that start from the training split's counted rates (``model.first_order_init = "rates"``).

A per-id bias learned by gradient steps orders the ids less exactly in one
epoch than their counted positive rates do (docs/models.md, "First-order
weights from counted rates"). So before the first step each first-order
row starts at its id's log-odds over the base rate, the rate smoothed by
``PRIOR_ROWS`` rows at the rate of its frequency class, divided by the number
of first-order features (their weights are summed into the logit):

    w(id) = (logit((pos + a q) / (n + a)) - logit(p)) / F
    q     = (pos_c + a p) / (n_c + a)

with ``n`` and ``pos`` the id's rows and positives in the rows read, ``p`` their
positive rate, ``a = PRIOR_ROWS``, and ``n_c``, ``pos_c`` the rows and positives
of the table's ids in the same frequency class ``c = floor(log2 n)`` (seen once,
2-3 times, 4-7 times, ...). An id seen a few times is pulled towards the ids
seen about as often, not towards all rows: how often an id occurs says something
of its rate (on the Amazon head, items rated 1-9 times in training were liked
more often than items rated 30 times or more). Every process of a job reads the
same rows, so each sets the rows it owns to what one process would.

>>> import numpy as np, torch
>>> from tierec.batch import SparseFeatures
>>> rates = IdRates({"t": ("a",)})
>>> sp = SparseFeatures.one_hot(("a",), torch.tensor([[1], [1], [2], [2]]))
>>> rates.add(sp, torch.tensor([1.0, 1.0, 0.0, 1.0]))
>>> ids, w = rates.weights(n_features=1)["t"]
>>> ids.tolist(), [round(float(x), 3) for x in w[:, 0]]
([1, 2], [0.236, -0.211])
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from tierec.batch import SparseFeatures

PRIOR_ROWS = 10.0  # rows of prior: at its class's rate for an id, at the base rate for a frequency class
_COMPACT_AT = 1 << 22  # (id, rows, positives) entries per table held before they are merged


class IdRates:
    """Rows and positives per id of each table, accumulated over batches (a table may serve several features)."""

    def __init__(self, features_by_table: dict[str, tuple[str, ...]]) -> None:
        self.features_by_table = features_by_table
        self.rows = 0
        self.positives = 0.0
        empty = (np.empty(0, dtype=np.int64), np.empty(0), np.empty(0))
        self._parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {t: [empty] for t in features_by_table}

    def add(self, sparse: SparseFeatures, labels: Tensor) -> None:
        y = labels.detach().to(torch.float64).cpu().numpy()
        self.rows += sparse.batch_size
        self.positives += float(y.sum())
        for table, feats in self.features_by_table.items():
            jagged = [sparse[f] for f in feats]
            ids = np.concatenate([j.values.numpy() for j in jagged])
            lab = np.concatenate([np.repeat(y, j.lengths.numpy()) for j in jagged])  # each id of a bag: its sample's label
            parts = self._parts[table]
            parts.append(_merged(ids, np.ones(ids.shape[0]), lab))
            if sum(p[0].shape[0] for p in parts) >= _COMPACT_AT:
                self._compact(table)

    def _compact(self, table: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = self._parts[table]
        if len(parts) > 1:
            self._parts[table] = parts = [_merged(*(np.concatenate(col) for col in zip(*parts)))]
        return parts[0]

    def weights(self, n_features: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per table: (ids [n] int64 ascending, weights [n, 1] float32), by the formula above; none when the rows
        read hold a single class (no base rate to measure against)."""
        if not 0 < self.positives < self.rows:
            return {}
        p = self.positives / self.rows
        base = math.log(p / (1.0 - p))
        out = {}
        for table in self._parts:
            ids, n, pos = self._compact(table)
            rate = (pos + PRIOR_ROWS * class_rates(n, pos, p)) / (n + PRIOR_ROWS)
            w = (np.log(rate / (1.0 - rate)) - base) / max(n_features, 1)
            out[table] = (ids.astype(np.int64, copy=False), w.astype(np.float32).reshape(-1, 1))
        return out


def class_rates(n: np.ndarray, pos: np.ndarray, p: float) -> np.ndarray:
    """Per id: the smoothed positive rate of the ids in its frequency class ``floor(log2 n)``.

    >>> class_rates(np.array([1.0, 1.0, 2.0, 3.0]), np.array([1.0, 1.0, 0.0, 1.0]), p=0.5).round(3).tolist()
    [0.583, 0.583, 0.4, 0.4]
    """
    c = np.floor(np.log2(np.maximum(n, 1.0))).astype(np.int64)
    rows, positives = np.bincount(c, weights=n), np.bincount(c, weights=pos)
    return ((positives + PRIOR_ROWS * p) / (rows + PRIOR_ROWS))[c]


def _merged(ids: np.ndarray, n: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unique ids, their summed ``n``, their summed ``pos``)."""
    uniq, inv = np.unique(ids, return_inverse=True)
    return uniq, np.bincount(inv, weights=n, minlength=uniq.shape[0]), np.bincount(inv, weights=pos, minlength=uniq.shape[0])
