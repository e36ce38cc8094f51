"""The engine benchmark's workload: pre-generated batches of Zipf-skewed ids.

Every system sees the same batches. Ids are drawn per table from a bounded
Zipf(s) over ``rows`` ranks (s = 0 is uniform), and each rank is mapped to an
id by a per-table bijection of ``[0, rows)`` so that hot ids are scattered over
the table rather than packed at its start. Static-index peers get those dense
indices; tierec gets raw 64-bit keys with the feature folded in,
``(f << 32) | index``.

>>> from benchmarks.workload import Workload, make_batches
>>> w = Workload(tables=2, rows=100, dim=4, batch=3, zipf=1.1, hot=2, steps=2)
>>> bs = make_batches(w)
>>> len(bs), bs[0].indices.shape, bs[0].offsets.tolist()
(2, torch.Size([12]), [0, 2, 4, 6, 8, 10, 12])
>>> int((bs[0].keys >> 32).max()), int(bs[0].indices.max()) < 100
(1, True)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor


SPARSE_OPTIMIZERS = ("rowwise_adagrad", "adagrad")


@dataclass(frozen=True, kw_only=True)
class Workload:
    tables: int = 26
    rows: int = 1_000_000  # per table
    dim: int = 16
    batch: int = 4096
    zipf: float = 1.1  # 0 = uniform
    hot: int = 1  # ids per sample per feature
    steps: int = 30  # batches per timed repeat
    lr: float = 0.05
    eps: float = 1e-8
    optimizer: str = "rowwise_adagrad"  # sparse optimizer: rowwise_adagrad or adagrad (element-wise; e2e only)
    seed: int = 0
    model: str = "small"  # e2e dense model: small (tierec's default DLRM) or mlperf (benchmarks.models)

    def __post_init__(self) -> None:
        for k in ("tables", "rows", "dim", "batch", "hot", "steps"):
            if getattr(self, k) <= 0:
                raise ValueError(f"{k} must be positive")
        if self.optimizer not in SPARSE_OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {SPARSE_OPTIMIZERS}, got {self.optimizer!r}")
        if self.zipf < 0:
            raise ValueError("zipf must be >= 0")
        if self.rows >= 1 << 32:
            raise ValueError("rows must fit in 32 bits (the feature is folded into the high bits)")

    def as_dict(self) -> dict:
        return asdict(self)

    def feature_names(self) -> list[str]:
        return [f"C{i + 1}" for i in range(self.tables)]

    def ids_per_batch(self) -> int:
        return self.tables * self.batch * self.hot


@dataclass(frozen=True)
class EngineBatch:
    indices: Tensor  # [N] int64 in [0, rows), feature-major (all of feature 0, then 1, ...)
    offsets: Tensor  # [T*B + 1] int64, bag f*B + b
    keys: Tensor  # [N] int64, (f << 32) | index: tierec's raw ids
    unique_rows: Tensor  # [U] int64, f * rows + index of the batch's unique (table, id) pairs


class ZipfSampler:
    """Bounded Zipf(s) over ranks [0, n) by inverse CDF; s = 0 draws uniformly."""

    def __init__(self, n: int, s: float) -> None:
        self.n, self.s = n, s
        if s > 0:
            p = np.arange(1, n + 1, dtype=np.float64) ** -s
            self.cdf = np.cumsum(p)
            self.cdf /= self.cdf[-1]

    def __call__(self, rng: np.random.Generator, size: int) -> np.ndarray:  # [size] int64
        if self.s == 0:
            return rng.integers(0, self.n, size=size, dtype=np.int64)
        r = np.searchsorted(self.cdf, rng.random(size), side="right")
        return np.minimum(r, self.n - 1).astype(np.int64)


def _bijection(rows: int, table: int, seed: int) -> tuple[int, int]:
    """(a, c) with gcd(a, rows) = 1, so rank -> (a * rank + c) % rows permutes [0, rows)."""
    rng = np.random.default_rng([seed, table, 7])
    while True:
        a = int(rng.integers(rows // 3 + 1, max(rows, 2) * 7 // 3 + 2)) | 1
        if math.gcd(a, rows) == 1:
            return a, int(rng.integers(0, rows))


def popularity_rank(w: Workload, table: int, ids: np.ndarray) -> np.ndarray:
    """[n] Zipf rank (0 = most used) of ``ids`` of ``table``: the inverse of :func:`table_ids`' permutation."""
    a, c = _bijection(w.rows, table, w.seed)
    return ((np.asarray(ids, dtype=np.int64) - c) * pow(a, -1, w.rows)) % w.rows


def table_ids(w: Workload, rng: np.random.Generator, sampler: ZipfSampler, table: int, size: int) -> np.ndarray:
    a, c = _bijection(w.rows, table, w.seed)
    return (sampler(rng, size) * a + c) % w.rows  # [size] int64


def make_batches(w: Workload, n: int | None = None, seed_offset: int = 0) -> list[EngineBatch]:
    """``n`` (default ``w.steps``) batches; generated once, before any timing."""
    rng = np.random.default_rng([w.seed, seed_offset])
    sampler = ZipfSampler(w.rows, w.zipf)
    per_table = w.batch * w.hot
    offsets = torch.arange(0, w.tables * per_table + 1, w.hot, dtype=torch.int64)  # [T*B+1]
    out = []
    for _ in range(n if n is not None else w.steps):
        idx = np.concatenate([table_ids(w, rng, sampler, t, per_table) for t in range(w.tables)])  # [N]
        feat = np.repeat(np.arange(w.tables, dtype=np.int64), per_table)  # [N]
        keys = (feat << 32) | idx
        unique = np.unique(feat * w.rows + idx)
        out.append(EngineBatch(torch.from_numpy(idx), offsets, torch.from_numpy(keys), torch.from_numpy(unique)))
    return out


def upstream_grad(w: Workload) -> Tensor:  # [B, T, D]
    """The fixed gradient every system receives on its pooled output."""
    g = torch.Generator().manual_seed(w.seed + 1)
    return torch.randn(w.batch, w.tables, w.dim, generator=g) * 0.01
