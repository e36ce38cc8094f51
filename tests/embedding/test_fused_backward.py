"""The row-parallel reduce + update equals pool_backward followed by the row-wise Adagrad step, bit for bit."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from tierec.batch import SparseFeatures
from tierec.config import OptimizerConfig, OptimizerKind, Pooling
from tierec.embedding import EmbeddingCollection, TableConfig
from tierec.embedding.group import TableGroup
from tierec.embedding.pooling import FUSED_MIN_DIM, FUSED_MIN_DIM_AVX512, fused_pays

FEATURES = ["a", "b", "c"]


def _collection(
    dim: int, kind: OptimizerKind = OptimizerKind.ROWWISE_ADAGRAD, fused: bool = True, shared: bool = True
) -> EmbeddingCollection:
    opt = OptimizerConfig(kind=kind, lr=0.05, weight_decay=0.01)
    if shared:  # the two-pass backward splits by column
        tables = [
            TableConfig(name="ab", dim=dim, features=["a", "b"], optimizer=opt),  # shared by two features
            TableConfig(name="c", dim=dim, features=["c"], optimizer=opt, pooling=Pooling.MEAN),
        ]
    else:  # one table per feature: on several threads the two-pass backward splits by feature
        tables = [
            TableConfig(name="a", dim=dim, features=["a"], optimizer=opt),
            TableConfig(name="b", dim=dim, features=["b"], optimizer=opt),
            TableConfig(name="c", dim=dim, features=["c"], optimizer=opt, pooling=Pooling.MEAN),
        ]
    coll = EmbeddingCollection(tables, FEATURES)
    if not fused:
        for g in coll.groups:
            g.fused_reduce_update = lambda *_: False  # the two-pass reference
    return coll


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("dim", [16, FUSED_MIN_DIM, 64, 96])
def test_fused_reduce_update_equals_the_two_pass_path(dim: int, shared: bool) -> None:
    fused, plain = _collection(dim, shared=shared), _collection(dim, fused=False, shared=shared)
    for g in fused.groups:
        g.fused_reduce_update = lambda *_: True  # at every dim, whatever the thread count
    assert not plain.groups[0].fused_reduce_update()
    g = np.random.default_rng(0)
    for step in range(6):
        # multi-hot bags with repeats and empty bags, few distinct ids: rows recur within and across steps
        ids = [[list(g.integers(0, 40, size=g.integers(0, 5))) for _ in range(48)] for _ in FEATURES]
        sp = SparseFeatures.from_lists(FEATURES, ids)
        grad = torch.randn(48, len(FEATURES), dim, generator=torch.Generator().manual_seed(step))
        fused(sp).backward(grad)
        plain(sp).backward(grad)
    a, b = fused.state_dict(), plain.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_fused_pays_rule() -> None:
    # The measured rule (docs/performance.md): several threads, the column-split backward, and
    # from dim 32 without AVX-512, from dim 64 with it.
    assert fused_pays(FUSED_MIN_DIM, 2, avx512=False) and not fused_pays(FUSED_MIN_DIM - 1, 2, avx512=False)
    assert not fused_pays(16, 1, avx512=False) and not fused_pays(64, 1, avx512=False)
    assert not fused_pays(64, 2, avx512=False, features_own_rows=True)
    assert fused_pays(FUSED_MIN_DIM_AVX512, 2, avx512=True) and not fused_pays(FUSED_MIN_DIM_AVX512, 1, avx512=True)
    assert not fused_pays(FUSED_MIN_DIM_AVX512 - 1, 2, avx512=True) and not fused_pays(16, 1, avx512=True)
    assert not fused_pays(FUSED_MIN_DIM_AVX512, 2, avx512=True, features_own_rows=True)


def test_fused_path_is_taken_only_where_it_applies() -> None:
    threads = numba.get_num_threads()
    try:
        for n in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(n)
            for dim in (16, 32, 64):
                g = _collection(dim).groups[0]
                assert g.fused_reduce_update() == fused_pays(dim, n, g.avx512)
    finally:
        numba.set_num_threads(threads)
    assert not _collection(64, OptimizerKind.ADAM).groups[0].fused_reduce_update()

    # a tiered group's update does more than the optimizer step (it skips the shared zero slot): two passes
    from tierec.store.tiered_group import TieredGroup
    from tierec.store.spec import TierSpec

    tiered = TieredGroup([TableConfig(name="t", dim=64, features=["f"])], TierSpec(cache_bytes=1 << 16, host_bytes=None))
    assert not tiered.fused_reduce_update()


def test_backward_split_by_feature_equals_split_by_column() -> None:
    # Features with rows of their own (one table each): the by-feature split gives bitwise the
    # sums of the by-column split, for any number of parts, with multi-hot and empty bags.
    from tierec.embedding.pooling import (
        backward_chunks,
        feature_bounds,
        pool_backward,
        pool_backward_by_feature,
    )

    g = np.random.default_rng(5)
    batch, n_features, dim = 40, 5, 16
    lengths = g.integers(0, 4, size=n_features * batch)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    feature_of_id = np.repeat(np.arange(n_features * batch) // batch, lengths)
    inverse = (feature_of_id * 7 + g.integers(0, 7, size=feature_of_id.shape[0])).astype(np.int64)  # 7 rows/feature
    scale = g.random(n_features * batch).astype(np.float32)
    grad_out = g.standard_normal((batch, n_features, dim)).astype(np.float32)
    ref = np.zeros((n_features * 7, dim), np.float32)
    pool_backward(grad_out, inverse, offsets, scale, batch, backward_chunks(dim), ref)
    for parts in (1, 2, 3, 8):
        bounds = feature_bounds(offsets, batch, parts)
        assert bounds[0] == 0 and bounds[-1] == n_features and np.all(np.diff(bounds) > 0)
        got = np.zeros_like(ref)
        pool_backward_by_feature(grad_out, inverse, offsets, scale, batch, bounds, got)
        assert np.array_equal(got, ref)
