"""Criteo-shaped synthetic batches with labels from a planted logistic model.

13 log-scaled dense features and ``Workload.tables`` categorical features with
Zipf-skewed ids (as in benchmarks.workload). The label of a sample is drawn
from ``sigmoid(bias + sum_f a_f * h(f, id_f) + dense @ v)``, where ``h`` hashes
each (feature, id) to a fixed value in [-sqrt(3), sqrt(3)]: a model that learns
the frequent ids' embeddings reaches a visibly better AUC than chance, and two
correct trainers reach the same AUC. (Used until tierec.data's generator lands;
it is self-contained so the benchmark does not depend on it.)

>>> from benchmarks.synthetic import make_ctr_batches
>>> from benchmarks.workload import Workload
>>> b = make_ctr_batches(Workload(tables=3, rows=100, batch=8), 2, seed_offset=0)
>>> len(b), b[0].dense.shape, b[0].labels.shape, b[0].ids.indices.shape
(2, torch.Size([8, 13]), torch.Size([8]), torch.Size([24]))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from benchmarks.workload import EngineBatch, Workload, ZipfSampler, table_ids

N_DENSE = 13


@dataclass(frozen=True)
class CTRBatch:
    dense: Tensor  # [B, 13] float32
    ids: EngineBatch  # sparse ids as dense indices and as tierec keys
    labels: Tensor  # [B] float32


def _mix64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def planted_effect(feature: int, ids: np.ndarray, seed: int) -> np.ndarray:  # [n] float64, mean 0, var 1
    with np.errstate(over="ignore"):
        h = _mix64(ids.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15) * np.uint64(feature + 1 + 1000 * seed))
    u = (h >> np.uint64(11)).astype(np.float64) / 2.0**53
    return (2.0 * u - 1.0) * np.sqrt(3.0)


def make_ctr_batches(w: Workload, n: int, seed_offset: int) -> list[CTRBatch]:
    rng = np.random.default_rng([w.seed, 1000 + seed_offset])
    model_rng = np.random.default_rng([w.seed, 77])  # the planted model: same for every call
    a = model_rng.uniform(0.0, 0.6, size=w.tables)  # per-feature strength
    v = model_rng.normal(0.0, 0.25, size=N_DENSE)
    dense_scale = model_rng.uniform(0.5, 20.0, size=N_DENSE)
    sampler = ZipfSampler(w.rows, w.zipf)
    per_table = w.batch * w.hot
    offsets = torch.arange(0, w.tables * per_table + 1, w.hot, dtype=torch.int64)
    out = []
    for _ in range(n):
        dense = np.log1p(rng.exponential(dense_scale, size=(w.batch, N_DENSE)))  # [B, 13]
        logit = -1.2 + (dense - np.log1p(dense_scale)) @ v  # [B]
        idx = []
        for t in range(w.tables):
            ids = table_ids(w, rng, sampler, t, per_table)  # [B*hot]
            logit += a[t] * planted_effect(t, ids, w.seed).reshape(w.batch, w.hot).mean(1)
            idx.append(ids)
        labels = (rng.random(w.batch) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        indices = np.concatenate(idx)
        feat = np.repeat(np.arange(w.tables, dtype=np.int64), per_table)
        unique = np.unique(feat * w.rows + indices)
        ids = EngineBatch(torch.from_numpy(indices), offsets, torch.from_numpy((feat << 32) | indices), torch.from_numpy(unique))
        out.append(CTRBatch(torch.from_numpy(dense.astype(np.float32)), ids, torch.from_numpy(labels)))
    return out


def tierec_data_batches(w: Workload, n: int, split: str, cardinality_scale: float = 0.025) -> list[CTRBatch]:
    """``n`` batches from tierec.data's synthetic generator (``open_source``), for the e2e run.

    tierec gets the generator's raw 64-bit ids. The static-index peers cannot
    hold a 32-bit id space, so they hash the ids into their ``rows`` slots
    (``id % rows``, as TorchRec users do); at the default scale the largest
    feature has about 253k ids for 1M slots, so hot ids rarely collide.
    """
    from tierec.config import DataConfig, SyntheticConfig
    from tierec.data import open_source

    rows_needed = n * w.batch
    cfg = SyntheticConfig(
        train_rows=rows_needed if split == "train" else w.batch,
        test_rows=rows_needed if split == "test" else w.batch,
        seed=w.seed,
        zipf=w.zipf,
        ids_per_feature=w.hot,
        cardinality_scale=cardinality_scale,
    )
    src = open_source(DataConfig(synthetic=cfg), split, batch_size=w.batch, drop_last=True)
    if src.n_dense != N_DENSE or len(src.feature_names) != w.tables:
        raise ValueError(f"tierec.data gives {src.n_dense} dense and {len(src.feature_names)} sparse features; "
                         f"the e2e workload needs {N_DENSE} and {w.tables} (--tables 26)")
    out = []
    for b in src:
        keys = b.sparse.values  # [N] int64, feature folded in by the generator
        offsets = b.sparse.offsets
        lengths = (offsets[w.batch :: w.batch] - offsets[: -1 : w.batch]).numpy()
        feat = np.repeat(np.arange(w.tables, dtype=np.int64), lengths)
        indices = (keys.numpy() & 0xFFFFFFFF) % w.rows
        unique = np.unique(feat * w.rows + indices)
        ids = EngineBatch(torch.from_numpy(indices), offsets, keys, torch.from_numpy(unique))
        out.append(CTRBatch(b.dense.float(), ids, b.labels.float()))
    return out[:n]
