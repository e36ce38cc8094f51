"""GroupPlan: where one table group's features sit in a batch, and packing their ids.

The single-process collection and the sharded one read a batch the same way:
for each storage (table group) the positions of its features in the batch,
the table each feature looks up, its pooling, and the packed ids of those
features (:func:`group_inputs`).

>>> import torch
>>> from tierec.batch import SparseFeatures
>>> from tierec.embedding.plan import group_inputs
>>> sp = SparseFeatures.one_hot(("a", "b"), torch.tensor([[1, 2], [3, 4]]))
>>> values, offsets, lengths = group_inputs(sp, (1,))
>>> values.tolist(), offsets.tolist(), lengths.tolist()
([2, 4], [0, 1, 2], [2])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tierec.batch import SparseFeatures
from tierec.config import Pooling


@dataclass(frozen=True)
class GroupPlan:
    group: Any  # the storage of the group (tierec.embedding.storage.RowStorage)
    features: tuple[int, ...]  # positions of this group's features in the batch's keys
    feature_table: np.ndarray  # [len(features)] int32, table index (within the group) per feature
    mean: np.ndarray  # [len(features)] bool, mean pooling per feature
    features_own_rows: bool  # one table per feature: no row is shared by two features

    @staticmethod
    def of(group: Any, feature_names: tuple[str, ...]) -> GroupPlan:
        """The plan of ``group`` (anything with ``tables``) for batches keyed by ``feature_names``."""
        feats, ftab, mean = [], [], []
        for ti, t in enumerate(group.tables):
            for f in t.features:
                feats.append(feature_names.index(f))
                ftab.append(ti)
                mean.append(t.pooling is Pooling.MEAN)
        order = np.argsort(feats, kind="stable")
        return GroupPlan(
            group=group,
            features=tuple(feats[i] for i in order),
            feature_table=np.array([ftab[i] for i in order], dtype=np.int32),
            mean=np.array([mean[i] for i in order], dtype=bool),
            features_own_rows=len(set(ftab)) == len(ftab),
        )


def group_inputs(sparse: SparseFeatures, features: tuple[int, ...]) -> tuple[Tensor, Tensor, np.ndarray]:
    """Values, offsets and per-feature id counts of a subset of features, packed."""
    b = sparse.batch_size
    n_feat = len(sparse.keys)
    if features == tuple(range(n_feat)):
        lengths = sparse.offsets[b :: b] - sparse.offsets[: -1 : b]  # [F]
        return sparse.values, sparse.offsets, lengths.numpy()
    vals, offs, lens = [], [torch.zeros(1, dtype=torch.int64)], []
    base = 0
    for f in features:
        o = sparse.offsets[f * b : (f + 1) * b + 1]
        vals.append(sparse.values[o[0] : o[-1]])
        offs.append(o[1:] - o[0] + base)
        n = int(o[-1] - o[0])
        lens.append(n)
        base += n
    return torch.cat(vals), torch.cat(offs), np.array(lens, dtype=np.int64)


def plan_ids(plan: GroupPlan, sparse: SparseFeatures) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids [N], their tables within the group [N] int32, bag offsets [F_g * B + 1]) of a group's features, in
    the order its lookup reads them (``sparse`` keyed as the plan's collection)."""
    values, offsets, lengths = group_inputs(sparse, plan.features)
    return values.numpy(), np.repeat(plan.feature_table, lengths), offsets.numpy()


def select_features(sparse: SparseFeatures, names: tuple[str, ...]) -> SparseFeatures:
    """Reorder / subset a batch's features to ``names``."""
    return SparseFeatures.from_jagged({n: sparse[n] for n in names})
