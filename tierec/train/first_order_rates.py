"""First-order weights that start from the training split's counted rates (``model.first_order_init = "rates"``).

A per-id bias learned by gradient steps orders the ids less exactly in one
epoch than their counted positive rates do (docs/models.md, "First-order
weights from counted rates"). So before the first step each first-order
row starts at its id's log-odds over the base rate, the rate smoothed by
``PRIOR_ROWS`` rows at the base rate, divided by the number of first-order
features (their weights are summed into the logit):

    w(id) = (logit((pos + a p) / (n + a)) - logit(p)) / F

with ``n`` and ``pos`` the id's rows and positives in the rows read, ``p`` their
positive rate and ``a = PRIOR_ROWS``. Every process of a job reads the same rows,
so each sets the rows it owns to what one process would.

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

PRIOR_ROWS = 10.0  # rows at the base rate that every id's rate is smoothed with
_COMPACT_AT = 1 << 22  # pending (id, count, positives) entries per table before they are merged


class IdRates:
    """Rows and positives per id of each table, accumulated over batches (a table may serve several features)."""

    def __init__(self, features_by_table: dict[str, tuple[str, ...]]) -> None:
        self.features_by_table = features_by_table
        self.rows = 0
        self.positives = 0.0
        self._parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {t: [] for t in features_by_table}
        self._pending = dict.fromkeys(features_by_table, 0)

    def add(self, sparse: SparseFeatures, labels: Tensor) -> None:
        y = labels.detach().to(torch.float64).cpu().numpy()
        b = sparse.batch_size
        self.rows += b
        self.positives += float(y.sum())
        offsets = sparse.offsets.numpy()
        values = sparse.values.numpy()
        for table, feats in self.features_by_table.items():
            ids, lab = [], []
            for f in feats:
                fi = sparse.keys.index(f)
                o = offsets[fi * b : (fi + 1) * b + 1]
                ids.append(values[o[0] : o[-1]])
                lab.append(np.repeat(y, np.diff(o)))  # every id of a sample's bag takes its label
            self._append(table, *_counted(np.concatenate(ids), np.concatenate(lab)))

    def _append(self, table: str, ids: np.ndarray, n: np.ndarray, pos: np.ndarray) -> None:
        self._parts[table].append((ids, n, pos))
        self._pending[table] += ids.shape[0]
        if self._pending[table] >= _COMPACT_AT:
            self._compact(table)

    def _compact(self, table: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = self._parts[table]
        if len(parts) != 1:
            ids = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, dtype=np.int64)
            uniq, inv = np.unique(ids, return_inverse=True)
            n = np.bincount(inv, weights=np.concatenate([p[1] for p in parts]) if parts else None, minlength=uniq.shape[0])
            pos = np.bincount(inv, weights=np.concatenate([p[2] for p in parts]) if parts else None, minlength=uniq.shape[0])
            self._parts[table] = parts = [(uniq, n, pos)]
        self._pending[table] = parts[0][0].shape[0]
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
            rate = (pos + PRIOR_ROWS * p) / (n + PRIOR_ROWS)
            w = (np.log(rate / (1.0 - rate)) - base) / max(n_features, 1)
            out[table] = (ids.astype(np.int64, copy=False), w.astype(np.float32).reshape(-1, 1))
        return out


def _counted(ids: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    uniq, inv = np.unique(ids, return_inverse=True)
    return uniq, np.bincount(inv, minlength=uniq.shape[0]).astype(np.float64), np.bincount(inv, weights=labels, minlength=uniq.shape[0])
