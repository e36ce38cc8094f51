"""The synthetic generator: determinism, skip-ahead, Zipf skew, planted labels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from data_helpers import assert_same_batches

from tierec.config import ConfigError, DataConfig, SyntheticConfig
from tierec.data import PlantedModel, SyntheticData, cardinalities, open_source, planted_logits, planted_scores
from tierec.data.hashing import HEX_FEATURE_SHIFT
from tierec.data.synth_kernels import unpermute
from tierec.data.schema import CRITEO_CARDINALITIES


def cfg_of(**kw: object) -> DataConfig:
    return DataConfig(synthetic=SyntheticConfig(**kw))


def test_deterministic_by_seed_and_split() -> None:
    a = list(open_source(cfg_of(train_rows=5000), "train", 1024))
    b = list(open_source(cfg_of(train_rows=5000), "train", 1024))
    assert_same_batches(a, b)
    c = next(iter(open_source(cfg_of(train_rows=5000, seed=1), "train", 1024)))
    assert not torch.equal(a[0].sparse.values, c.sparse.values)
    t = next(iter(open_source(cfg_of(test_rows=5000), "test", 1024)))
    assert not torch.equal(a[0].sparse.values, t.sparse.values) and not torch.equal(a[0].dense, t.dense)


def test_skip_ahead_and_batch_size_independence() -> None:
    cfg = cfg_of(train_rows=10_000)
    full = list(open_source(cfg, "train", 1000))
    assert_same_batches(list(open_source(cfg, "train", 1000, start_batch=7)), full[7:])
    # rows are a function of the row index: two batches of 500 are one batch of 1000
    halves = list(open_source(cfg, "train", 500, start_batch=4))[:2]
    joined = SyntheticData(cfg.synthetic).block("train", 2000, 1000)[0]
    assert torch.equal(torch.cat([h.labels for h in halves]), torch.from_numpy(joined.labels))
    assert torch.equal(torch.cat([h.dense for h in halves]), torch.from_numpy(joined.dense))
    ids = torch.cat([h.sparse.values.view(26, 500) for h in halves], dim=1)
    assert torch.equal(ids, torch.from_numpy(joined.values).view(26, 1000))


def test_all_split_is_train_then_test() -> None:
    cfg = cfg_of(train_rows=1000, test_rows=300)
    every = open_source(cfg, "all", 256, start_batch=1)
    assert every.num_rows == 1300 and every.num_batches == 6
    rows = list(every)
    assert sum(b.size for b in rows) == 1300 - 256
    train, test = list(open_source(cfg, "train", 1000)), list(open_source(cfg, "test", 300))
    labels = torch.cat([b.labels for b in rows])
    assert torch.equal(labels, torch.cat([train[0].labels[256:], test[0].labels]))


def test_shape_names_and_id_folding() -> None:
    src = open_source(cfg_of(train_rows=4096), "train", 4096)
    assert src.feature_names == tuple(f"C{i}" for i in range(1, 27)) and src.n_dense == 13
    assert src.dense_names == tuple(f"I{i}" for i in range(1, 14)) and src.multi_hot == ()
    (b,) = list(src)
    assert b.dense.shape == (4096, 13) and b.dense.dtype == torch.float32 and bool((b.dense >= 0).all())
    assert b.labels.dtype == torch.float32 and set(b.labels.unique().tolist()) <= {0.0, 1.0}
    model = PlantedModel.from_config(SyntheticConfig())
    cards = cardinalities(SyntheticConfig())
    assert cards == tuple(max(2, round(c * 0.01)) for c in CRITEO_CARDINALITIES)
    for f, key in enumerate(src.feature_names):
        ids = b.sparse[key].values.numpy()
        assert (ids >> HEX_FEATURE_SHIFT == f).all()
        ranks = unpermute(ids & 0xFFFFFFFF, model.perm_keys[f])
        assert ranks.min() >= 0 and ranks.max() < cards[f]


@pytest.mark.parametrize("zipf", [1.3, 1.0, 0.0])
def test_rank_table_agrees_with_the_inverse_cdf(zipf: float) -> None:
    from tierec.data.synth_kernels import RANK_BINS, rank_of

    m = PlantedModel.from_config(SyntheticConfig(zipf=zipf, cardinality_scale=1.0))
    us = (np.random.default_rng(1).integers(0, 2**53, 20_000) + 0.5) * 2.0**-53
    for f in (2, 8, 20):  # 10M, 3 and 7M ids at scale 1
        table, zc = m.rank_table[f], m.zipf_c[f]
        direct = [rank_of(u, zc, m.zipf_inv, m.zipf_mode, m.cards[f]) for u in us]
        bins = (us * RANK_BINS).astype(np.int64)
        via = np.where(table[bins] == table[bins + 1], table[bins], direct)
        assert np.array_equal(via, direct)


def test_multi_hot_bags() -> None:
    src = open_source(cfg_of(train_rows=100, ids_per_feature=3), "train", 64)
    b = next(iter(src))
    assert src.multi_hot == src.feature_names
    assert b.sparse["C5"].lengths.tolist() == [3] * 64 and b.sparse.values.numel() == 26 * 64 * 3


def test_zipf_head_share_of_large_features() -> None:
    """At the default exponent the hottest 1% of a large feature's ids take about 90% of accesses."""
    data = SyntheticData(SyntheticConfig())
    block, _ = data.block("train", 0, 400_000)
    ids = block.values.reshape(26, -1)
    cards = data.model.cards
    shares = []
    for f in np.flatnonzero(cards >= 10_000):
        _, counts = np.unique(ids[f], return_counts=True)
        top = np.sort(counts)[::-1][: int(round(0.01 * cards[f]))]
        shares.append(top.sum() / counts.sum())
    assert len(shares) == 5
    print("top-1% access share per large feature:", [round(float(s), 3) for s in shares])
    assert 0.85 <= float(np.mean(shares)) <= 0.95 and min(shares) > 0.8
    uniform = SyntheticData(SyntheticConfig(zipf=0.0)).block("train", 0, 100_000)[0].values.reshape(26, -1)
    f = int(np.argmax(cards))
    _, counts = np.unique(uniform[f], return_counts=True)
    assert np.sort(counts)[::-1][: int(0.01 * cards[f])].sum() / counts.sum() < 0.05


@pytest.mark.parametrize("rate", [0.25, 0.1])
def test_planted_labels_base_rate(rate: float) -> None:
    block, logits = SyntheticData(SyntheticConfig(positive_rate=rate)).block("test", 0, 100_000)
    assert abs(float(block.labels.mean()) - rate) < 0.01
    prob = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    assert abs(prob.mean() - rate) < 0.01
    assert 1.2 < float(logits.std()) < 2.2


def test_planted_model_is_informative_and_scores_any_batch() -> None:
    from sklearn.metrics import roc_auc_score

    cfg = SyntheticConfig(test_rows=50_000)
    data = SyntheticData(cfg)
    block, logits = data.block("test", 0, 50_000)
    auc = roc_auc_score(block.labels, logits)
    assert 0.78 < auc < 0.88
    batches = list(open_source(DataConfig(synthetic=cfg), "test", 8192))
    model = PlantedModel.from_config(cfg)
    again = torch.cat([planted_logits(model, b) for b in batches])
    assert torch.equal(again, torch.from_numpy(logits))
    assert torch.equal(planted_scores(cfg, "test", 2, 8192), again[2 * 8192 : 3 * 8192])


def test_feature_importances_differ_widely() -> None:
    imp = PlantedModel.from_config(SyntheticConfig()).importance  # std of each feature's logit term
    assert imp.max() / imp.min() > 50
    assert (imp < 0.05 * imp.max()).sum() >= 5  # several features are close to useless
    assert imp.max() > 0.5


def test_planted_importance_is_what_the_logits_show() -> None:
    """Shuffling ids of an unimportant feature barely moves the logits; of the top feature it does."""
    cfg = SyntheticConfig()
    data = SyntheticData(cfg)
    block, logits = data.block("train", 0, 20_000)
    imp = data.model.importance
    moved = []
    for f in (int(np.argmin(imp)), int(np.argmax(imp))):
        values = block.values.reshape(26, -1).copy()
        values[f] = np.random.default_rng(0).permutation(values[f])
        shuffled = data.model.logits(block.dense, values.reshape(-1), block.offsets)
        moved.append(float(np.abs(shuffled - logits).mean()))
    assert moved[0] < 0.01 < 0.3 < moved[1]


def test_synthetic_config_validation() -> None:
    for bad in ({"ids_per_feature": 0}, {"positive_rate": 1.0}, {"cardinality_scale": 1000.0}, {"zipf": -1.0}):
        with pytest.raises(ConfigError):
            SyntheticConfig(**bad)  # type: ignore[arg-type]
