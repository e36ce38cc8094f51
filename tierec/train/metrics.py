"""Evaluation metrics for binary CTR prediction: exact ROC AUC and log loss.

Both are computed in float64 on the CPU (the inputs are copied there), so
results do not depend on the device and match scikit-learn. Labels count as
positive when ``> 0.5``.

>>> import torch
>>> from tierec.train.metrics import EvalAccumulator, auc, logloss
>>> auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))
0.75
>>> round(logloss(torch.tensor([0.0, 0.0]), torch.tensor([0.0, 1.0])), 4)  # log 2
0.6931
>>> acc = EvalAccumulator()
>>> acc.update(torch.tensor([2.0, -1.0]), torch.tensor([1.0, 0.0]))
>>> acc.update(torch.tensor([0.5]), torch.tensor([0.0]))
>>> r = acc.compute()
>>> r["auc"], r["rows"], round(r["positive_rate"], 3)
(1.0, 3, 0.333)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def _flat64(x: Tensor) -> Tensor:
    return x.detach().reshape(-1).to(device="cpu", dtype=torch.float64)


def auc(scores: Tensor, labels: Tensor) -> float:
    """Exact ROC AUC (Mann-Whitney U with average ranks for ties).

    ``scores`` may be logits or probabilities (AUC only uses their order).
    Returns nan when only one class is present, the input is empty, or a score is nan.
    """
    s, y = _flat64(scores), _flat64(labels) > 0.5  # [N], [N] bool
    if s.shape != y.shape:
        raise ValueError(f"scores has {s.numel()} values but labels has {y.numel()}")
    n_pos = int(y.sum())
    n_neg = y.numel() - n_pos
    if n_pos == 0 or n_neg == 0 or bool(torch.isnan(s).any()):
        return math.nan
    sorted_scores, order = torch.sort(s)
    _, group, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    # Tied scores share the mean of the 1-based ranks they span: end - (count - 1) / 2.
    mean_rank = counts.cumsum(0).to(torch.float64) - (counts - 1).to(torch.float64) / 2  # [G]
    positives_per_group = torch.zeros_like(mean_rank).index_add_(0, group, y[order].to(torch.float64))  # [G]
    rank_sum = float((positives_per_group * mean_rank).sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def logloss(logits: Tensor, labels: Tensor) -> float:
    """Mean binary cross-entropy of ``sigmoid(logits)`` against ``labels`` (nan if empty)."""
    x, y = _flat64(logits), _flat64(labels)
    if x.shape != y.shape:
        raise ValueError(f"logits has {x.numel()} values but labels has {y.numel()}")
    if x.numel() == 0:
        return math.nan
    # softplus-based and stable for large |logits|.
    return float(F.binary_cross_entropy_with_logits(x, y))


class EvalAccumulator:
    """Collects logits and labels over evaluation batches; ``compute`` gives the metrics.

    Values are copied to the CPU as float32 on ``update``; memory is 8 bytes a row.
    """

    def __init__(self) -> None:
        self._logits: list[Tensor] = []  # each [b] float32, cpu
        self._labels: list[Tensor] = []  # each [b] float32, cpu
        self._rows = 0

    def update(self, logits: Tensor, labels: Tensor) -> None:
        """Add one batch: ``logits [B]`` and ``labels [B]`` (0/1)."""
        if logits.numel() != labels.numel():
            raise ValueError(f"logits has {logits.numel()} values but labels has {labels.numel()}")
        self._logits.append(logits.detach().reshape(-1).to(device="cpu", dtype=torch.float32))
        self._labels.append(labels.detach().reshape(-1).to(device="cpu", dtype=torch.float32))
        self._rows += logits.numel()

    def __len__(self) -> int:
        return self._rows

    def reset(self) -> None:
        self._logits.clear()
        self._labels.clear()
        self._rows = 0

    def tensors(self) -> tuple[Tensor, Tensor]:
        """All collected ``(logits [N], labels [N])``, e.g. to gather them across ranks."""
        empty = torch.empty(0, dtype=torch.float32)
        return (
            torch.cat(self._logits) if self._logits else empty,
            torch.cat(self._labels) if self._labels else empty,
        )

    def compute(self) -> dict[str, float]:
        """``{"auc", "logloss", "rows", "positive_rate"}``; nan where undefined (``rows`` is an int)."""
        logits, labels = self.tensors()
        rows = int(labels.numel())
        return {
            "auc": auc(logits, labels),
            "logloss": logloss(logits, labels),
            "rows": rows,
            "positive_rate": float((labels > 0.5).to(torch.float64).mean()) if rows else math.nan,
        }
