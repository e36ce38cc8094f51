"""The pruning step: budget / ratio met, bytes really fall, free-list reuse, regrowth, compaction."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tierec.batch import SparseFeatures
from tierec.config import OptimizerConfig, OptimizerKind, PruneConfig
from tierec.embedding import EmbeddingCollection, TableConfig
from tierec.prune import PrunedGroup, Pruner
from tierec.prune.select import OneProcess, Positions, select, select_spread
from tierec.storage import storage_factory
from tierec.embedding.storage import whole_table_state

DIM, CHUNK = 8, 2


def _coll(cfg: PruneConfig, kind: OptimizerKind = OptimizerKind.ROWWISE_ADAGRAD) -> EmbeddingCollection:
    opt = OptimizerConfig(kind=kind, lr=0.05)
    tables = [TableConfig(name=n, dim=DIM, features=[n], optimizer=opt) for n in ("hot", "weak")]
    return EmbeddingCollection(tables, ["hot", "weak"], group_factory=storage_factory(prune=cfg))


def _train(coll: EmbeddingCollection, steps: int, seed: int = 0, id_base: int = 0, weak_grad: float = 0.01) -> None:
    """Zipf ids on both features; the loss barely depends on feature "weak" (its gradient is scaled down)."""
    g = np.random.default_rng(seed)
    for s in range(steps):
        ids = np.minimum(g.zipf(1.3, size=(2, 64)), 400) + id_base
        sp = SparseFeatures.one_hot(("hot", "weak"), torch.from_numpy(ids.T.copy()))
        out = coll(sp)  # [B, 2, D]
        scale = torch.tensor([1.0, weak_grad]).view(1, 2, 1)
        target = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed * 1000 + s))
        (((out - target) ** 2) * scale).sum().backward()


def _group(coll: EmbeddingCollection) -> PrunedGroup:
    return coll.groups[0]


def test_ratio_is_met_and_bytes_really_fall() -> None:
    cfg = PruneConfig(enabled=True, chunk=CHUNK, target_ratio=4.0)
    coll = _coll(cfg)
    _train(coll, 20)
    g = _group(coll)
    before_total, before_pool, cap = coll.nbytes(), g.pool_bytes(), g.chunks.capacity
    assert g.dim_histogram()[-1] == g.num_rows  # every row starts at full dim
    step = Pruner(coll, cfg).step()
    # 4x fewer bytes than plain tables would hold for these rows, everything per chunk included
    assert step.value_bytes <= step.target_bytes == g.full_value_bytes() // 4
    assert step.value_bytes > 0.99 * step.target_bytes  # and the budget is used
    assert g.pool_bytes() < before_pool / 4  # the tensors really shrank
    assert g.chunks.weights.shape[0] == g.chunks.capacity < cap / 4
    assert coll.nbytes() < before_total
    assert step.pruned > 0 and step.regrown == 0  # every row started at full dim


def test_memory_budget_in_bytes() -> None:
    cfg = PruneConfig(enabled=True, chunk=CHUNK, memory_budget=3000)
    coll = _coll(cfg)
    _train(coll, 10)
    pruner = Pruner(coll, cfg)
    pruner.step()
    g = _group(coll)
    assert 2950 < g.pool_bytes() + g.row_state_bytes() <= 3000


def test_important_rows_keep_more_dims() -> None:
    cfg = PruneConfig(enabled=True, evict_empty_rows=False, chunk=CHUNK, target_ratio=3.0)
    coll = _coll(cfg)
    _train(coll, 30)
    Pruner(coll, cfg).step()
    g = _group(coll)
    live = g.live_chunks()
    tabs = g.index.row_tabs[: g.num_rows]
    hot_rows, weak_rows = np.flatnonzero(tabs == 0), np.flatnonzero(tabs == 1)
    # the feature the loss hardly depends on loses more than the other, and frequent ids keep more
    assert live[weak_rows].mean() < 0.5 * live[hot_rows].mean()
    keys = g.index.row_keys[: g.num_rows]
    head, tail = hot_rows[keys[hot_rows] <= 3], hot_rows[keys[hot_rows] > 50]
    assert live[head].mean() == DIM // CHUNK and live[tail].mean() < 0.7 * (DIM // CHUNK)


def test_frequency_importance_ignores_the_gradient() -> None:
    cfg = PruneConfig(enabled=True, evict_empty_rows=False, chunk=CHUNK, target_ratio=3.0, importance="frequency")
    coll = _coll(cfg)
    _train(coll, 30)
    Pruner(coll, cfg).step()
    g = _group(coll)
    live, tabs = g.live_chunks(), g.index.row_tabs[: g.num_rows]
    assert abs(live[tabs == 0].mean() - live[tabs == 1].mean()) < 0.5  # both features alike


@pytest.mark.parametrize("fused", [True, False])
def test_importance_counts_accesses_not_batches(fused: bool) -> None:
    # FIITED's access frequency: an id used by three samples of a batch is three accesses
    cfg = PruneConfig(enabled=True, chunk=CHUNK, importance="frequency")
    coll, grad = _coll(cfg), _coll(PruneConfig(enabled=True, chunk=CHUNK))  # grad: gradient importance
    ids = torch.tensor([[5, 1], [5, 1], [5, 2], [6, 2]])  # per batch: hot 5 x3, 6 x1; weak 1 x2, 2 x2
    for c in (coll, grad):
        c.use_fused_kernels = fused
        for _ in range(2):
            c(SparseFeatures.one_hot(("hot", "weak"), ids)).sum().backward()
    g = _group(coll)
    rows = g.index.lookup(np.array([5, 6, 1, 2], dtype=np.int64), np.array([0, 0, 1, 1], dtype=np.int8), insert=False).rows
    imp = g.chunks.importance[g.cmap[rows]]  # [4 rows, D / c chunks]
    np.testing.assert_array_equal(imp, np.repeat([[6.0], [2.0], [4.0], [4.0]], DIM // CHUNK, axis=1))
    gg = _group(grad)  # with gradient importance, the shrinkage's count of accesses
    rows = gg.index.lookup(np.array([5, 6], dtype=np.int64), np.array([0, 0], dtype=np.int8), insert=False).rows
    np.testing.assert_array_equal(gg.count[rows], [6.0, 2.0])


@pytest.mark.parametrize("fused", [True, False])
def test_gradient_importance_is_the_norm_of_the_rows_batch_gradient(fused: bool) -> None:
    # per chunk, ||sum of the row's gradients over its accesses in the batch||
    coll = _coll(PruneConfig(enabled=True, chunk=CHUNK))
    coll.use_fused_kernels = fused
    ids = torch.tensor([[5, 1], [5, 1], [6, 1]])
    w = torch.randn(3, 2, DIM, generator=torch.Generator().manual_seed(3))  # d loss / d output
    (coll(SparseFeatures.one_hot(("hot", "weak"), ids)) * w).sum().backward()
    g = _group(coll)
    rows = g.index.lookup(np.array([5, 6, 1], dtype=np.int64), np.array([0, 0, 1], dtype=np.int8), insert=False).rows
    summed = torch.stack([w[0, 0] + w[1, 0], w[2, 0], w[:, 1].sum(dim=0)])  # [3 rows, D]
    expect = summed.view(3, DIM // CHUNK, CHUNK).norm(dim=-1).numpy()
    np.testing.assert_allclose(g.chunks.importance[g.cmap[rows]], expect, rtol=1e-6)


def test_freed_chunks_are_reused_before_the_pool_grows() -> None:
    cfg = PruneConfig(enabled=True, chunk=CHUNK)
    coll = _coll(cfg)
    _train(coll, 10)
    g = _group(coll)
    cap = g.chunks.capacity
    rows = np.arange(0, g.num_rows, 2)
    freed = set(g.cmap[rows].ravel().tolist())
    g.set_row_dims(rows, np.zeros(rows.size, dtype=np.int64))  # frees chunks without compacting
    free_before = g.chunks.num_free
    rows_before = g.num_rows
    _train(coll, 1, seed=7, id_base=10_000)  # new ids: new full-dim rows
    new_chunks = (g.num_rows - rows_before) * (DIM // CHUNK)
    assert 0 < new_chunks <= len(freed)
    assert g.chunks.capacity == cap and g.chunks.num_free == free_before - new_chunks
    new_ids = g.cmap[rows_before : g.num_rows].ravel()
    assert set(new_ids.tolist()) <= freed  # the freed chunks, not the pool's spare tail


def test_pool_over_budget_is_compacted_even_when_little_is_free() -> None:
    cfg = PruneConfig(enabled=True, chunk=CHUNK, target_ratio=2.0, compact_free_fraction=1.0)
    coll = _coll(cfg)
    _train(coll, 10)
    pruner = Pruner(coll, cfg)
    step = pruner.step()
    g = _group(coll)
    assert step.pruned > 0 and g.chunks.num_free == 0 and pruner.compactions == 1
    assert g.pool_bytes() + g.row_state_bytes() <= step.target_bytes


def test_compaction_keeps_every_row_and_state() -> None:
    cfg = PruneConfig(enabled=True, chunk=CHUNK, compact_free_fraction=1.0)
    coll = _coll(cfg, OptimizerKind.ADAM)
    _train(coll, 5)
    g = _group(coll)
    rows = np.arange(g.num_rows)
    g.set_row_dims(rows, (rows % 5) * CHUNK)
    before = {k: v.clone() for k, v in whole_table_state(g, 0).items()}
    w = g.gather(rows)
    g.compact()
    assert g.chunks.num_free == 0 and g.chunks.capacity == g.live_chunks().sum()
    _, length = g.segments(rows)
    assert (length == g.live_chunks()).all()  # every row laid out in one run
    assert torch.equal(g.gather(rows), w)
    after = whole_table_state(g, 0)
    for k in before:
        assert torch.equal(before[k], after[k]), k
    _train(coll, 2, seed=3)  # and it still trains


def test_pruned_chunks_grow_back_when_the_row_becomes_important() -> None:
    # shrinkage 0: its per-row count would not fit an 8x budget with every row kept (evict_empty_rows off)
    cfg = PruneConfig(enabled=True, evict_empty_rows=False, chunk=CHUNK, target_ratio=8.0, regrow_margin=1.0, decay=0.1, shrinkage=0.0)
    coll = _coll(cfg)
    _train(coll, 10)
    pruner = Pruner(coll, cfg)
    pruner.step()
    g = _group(coll)
    # feature "weak" becomes the one that matters: its rows claim chunks back
    _train(coll, 20, seed=5, weak_grad=100.0)
    live_before = g.live_chunks()
    step = pruner.step()
    assert step.regrown > 0 and g.regrown.sum() == step.regrown
    grown = np.flatnonzero(g.live_chunks() > live_before)
    assert grown.size and (g.index.row_tabs[grown] == 1).mean() > 0.9
    assert (g.live_chunks()[grown] == live_before[grown] + 1).all()  # one chunk per step
    stats = pruner.stats()
    assert stats["regrown_chunks"] == step.regrown and stats["pruned_chunks"] > 0
    assert sum(stats["dim_hist"].values()) == g.num_rows


def test_no_regrowth_when_disabled() -> None:
    cfg = PruneConfig(enabled=True, evict_empty_rows=False, chunk=CHUNK, target_ratio=8.0, regrow=False)
    coll = _coll(cfg)
    _train(coll, 10)
    pruner = Pruner(coll, cfg)
    pruner.step()
    live = _group(coll).live_chunks()
    _train(coll, 10, seed=5, weak_grad=100.0)
    assert pruner.step().regrown == 0
    assert (_group(coll).live_chunks()[: live.size] <= live).all()


def test_rows_pruned_to_nothing_are_forgotten_and_come_back_as_new_rows() -> None:
    cfg = PruneConfig(enabled=True, chunk=CHUNK, target_ratio=4.0)
    coll = _coll(cfg)
    _train(coll, 20)
    g = _group(coll)
    rows_before, index_bytes, total = g.num_rows, g.index.nbytes(), coll.nbytes()
    step = Pruner(coll, cfg).step()
    assert g.evicted.sum() > 0 and g.num_rows == rows_before - g.evicted.sum()
    assert (g.live_chunks() > 0).all()
    assert g.index.nbytes() < index_bytes and coll.nbytes() < total
    assert step.target_bytes == g.full_value_bytes() // 4  # evicted rows still count in the reference
    # an evicted id reads as zeros at evaluation, and training inserts it again at full dim
    kept = set(zip(g.index.row_tabs[: g.num_rows].tolist(), g.index.row_keys[: g.num_rows].tolist()))
    gone = next(k for k in range(1, 401) if (0, k) not in kept)
    sp = SparseFeatures.one_hot(("hot", "weak"), torch.tensor([[gone, gone]]))
    coll.eval()
    with torch.no_grad():
        assert coll(sp)[0, 0].abs().sum() == 0
    coll.train()
    coll(sp).sum().backward()
    row = int(g.lookup(np.array([gone]), np.array([0], dtype=np.int32), insert=False)[0])
    assert row >= 0 and g.live_chunks(np.array([row]))[0] == DIM // CHUNK


def test_selection_fills_the_budget_exactly_through_ties() -> None:
    s = np.array([[3, 2, 2, 1], [2, 2, 1, 1]], dtype=np.float32)
    for budget, want in [(30, [3, 0]), (25, [2, 0]), (50, [3, 2]), (40, [3, 1]), (1000, [4, 4]), (0, [0, 0])]:
        counts, _ = select([s], [10], budget)
        assert counts[0].tolist() == want, budget
    must = np.array([[np.inf, 1, -np.inf]], dtype=np.float32)  # min_dim and no-regrowth positions
    assert select([must], [10], 0)[0][0].tolist() == [1] and select([must], [10], 100)[0][0].tolist() == [2]
    a, b = np.array([[5.0, 1.0]], np.float32), np.array([[4.0, 3.0]], np.float32)
    counts, _ = select([a, b], [10, 20], 40)  # 5 (10 B) + 4 (20 B) fit, 3 does not
    assert [c.tolist() for c in counts] == [[1], [1]]
    # a row's first chunk also pays for its per-row state: 9 + 5 and 8 + 5 fit in 27, not a third chunk
    s2 = np.array([[9, 1], [8, 2]], dtype=np.float32)
    assert select([s2], [10], 27, row_bytes=[4])[0][0].tolist() == [1, 0]
    assert select([s2], [10], 28, row_bytes=[4])[0][0].tolist() == [1, 1]


def _spread(groups, sizes, budget, keys, row_bytes, n_parts, rng):
    """select_spread over the rows cut into ``n_parts`` parts at random (as processes would hold them)."""
    cuts = [np.sort(rng.integers(0, s.shape[0] + 1, size=n_parts - 1)) for s in groups]
    bounds = [np.concatenate([[0], c, [s.shape[0]]]) for c, s in zip(cuts, groups)]
    parts = [
        Positions([s[b[i]:b[i + 1]] for s, b in zip(groups, bounds)], sizes,
                  [k[b[i]:b[i + 1]] for k, b in zip(keys, bounds)], row_bytes)
        for i in range(n_parts)
    ]
    per_part, tau = select_spread(parts, budget, OneProcess())
    return [np.concatenate([pp[g] for pp in per_part]) for g in range(len(groups))], tau


def test_histogram_selection_over_spread_rows_equals_the_plain_sort() -> None:
    g = np.random.default_rng(0)
    for trial in range(40):
        groups = []
        for _ in range(2):
            raw = g.integers(0, 6, size=(40, 4)).astype(np.float32) * np.float32(g.choice([1.0, 0.37, 1e-30]))
            raw[g.random(40) < 0.2, 2:] = -np.inf  # rows that may not grow
            raw[g.random(40) < 0.1, 0] = np.inf  # min_dim: must keep
            groups.append(np.maximum.accumulate(raw[:, ::-1], axis=1)[:, ::-1].copy())  # suffix max
        perm = g.permutation(80).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # distinct 64-bit tie keys
        keys = [perm[:40], perm[40:]]
        budget = int(g.integers(-50, 3000))
        for sizes, rb in (([10, 10], [0, 0]), ([10, 10], [7, 7]), ([10, 24], [3, 0])):
            plain, tau = select(groups, sizes, budget, keys, rb)
            spent = sum(int(c.sum()) * b + int((c > 0).sum()) * r for c, b, r in zip(plain, sizes, rb))
            must = sum(int((s == np.inf).sum()) * b + int((s[:, 0] == np.inf).sum()) * r for s, b, r in zip(groups, sizes, rb))
            assert spent <= max(budget, must), (trial, sizes)
            for n_parts in (1, 3):
                spread, tau2 = _spread(groups, sizes, budget, keys, rb, n_parts, g)
                assert all((a == b).all() for a, b in zip(plain, spread)), (trial, sizes, n_parts)
                assert tau == tau2


def test_select_on_distinct_scores_keeps_the_top_that_fit() -> None:
    g = np.random.default_rng(1)
    s = np.sort(g.random((50, 3)).astype(np.float32), axis=1)[:, ::-1].copy()
    for budget in (0, 10, 333, 1500):
        counts, tau = select([s], [10], budget)
        top = np.sort(s.ravel())[::-1][: budget // 10]
        assert int(counts[0].sum()) == top.size
        assert tau == (-np.inf if top.size == s.size else np.inf if top.size == 0 else top.min())


@pytest.mark.parametrize("kind", list(OptimizerKind))
def test_every_optimizer_prunes_and_trains(kind: OptimizerKind) -> None:
    cfg = PruneConfig(enabled=True, chunk=CHUNK, target_ratio=2.0, every=5)
    coll = _coll(cfg, kind)
    pruner = Pruner(coll, cfg)
    for s in range(1, 16):
        _train(coll, 1, seed=s)
        if pruner.due(s):
            pruner.step()
    g = _group(coll)
    assert g.value_bytes() <= g.full_value_bytes() / 2 + g.chunks.bytes_per_chunk() * 200
    assert torch.isfinite(g.chunks.weights).all()


def test_shrunk_importance_matches_a_written_out_reference() -> None:
    """Score n (S + k m) / (n + k), m = the table's sum of S over its sum of n at that position."""
    k = 5.0
    cfg = PruneConfig(enabled=True, evict_empty_rows=False, chunk=CHUNK, shrinkage=k)
    coll = _coll(cfg)
    _train(coll, 12)
    g = _group(coll)
    rows = np.arange(g.num_rows)
    g.set_row_dims(rows, (rows % (DIM // CHUNK + 1)) * CHUNK)  # some prefixes of every length
    _train(coll, 6, seed=2)
    imp, claim = g.shrunk_importance()
    raw, n_rows, n_pos = g.chunks.importance, g.num_rows, DIM // CHUNK
    tabs = g.index.row_tabs[:n_rows]
    assert g.count[:n_rows].max() > 1 and g.count[:n_rows].min() >= 0
    s_sum, n_sum = {}, {}
    for r in range(n_rows):
        for q in range(n_pos):
            p = g.cmap[r, q]
            if p >= 0:
                key = (int(tabs[r]), q)
                s_sum[key] = s_sum.get(key, 0.0) + float(raw[p])
                n_sum[key] = n_sum.get(key, 0.0) + float(g.count[r])
    for r in range(n_rows):
        n = float(g.count[r])
        live = 0
        for q in range(n_pos):
            p = g.cmap[r, q]
            if p < 0:
                break
            live += 1
            m = s_sum[(int(tabs[r]), q)] / n_sum[(int(tabs[r]), q)]
            assert imp[p] == pytest.approx(n * (float(raw[p]) + k * m) / (n + k), rel=1e-5)
        if live < n_pos and (int(tabs[r]), live) in s_sum:
            m = s_sum[(int(tabs[r]), live)] / n_sum[(int(tabs[r]), live)]
            assert claim[r] == pytest.approx(n * (float(g.next_imp[r]) + k * m) / (n + k), rel=1e-5)


def test_shrinkage_ranks_a_rarely_seen_row_of_an_important_table_above_noise() -> None:
    """One access with a large gradient: without shrinkage it outranks rows seen many times."""
    cfg = PruneConfig(enabled=True, evict_empty_rows=False, chunk=CHUNK, shrinkage=8.0)
    g = PrunedGroup([TableConfig(name="t", dim=DIM, features=["t"])], cfg)
    rows = g.lookup(np.arange(3, dtype=np.int64), np.zeros(3, dtype=np.int32), insert=True)
    for step in range(20):  # rows 0 and 1 are seen every step with small gradients
        g.update(rows[:2], torch.full((2, DIM), 0.1))
    g.update(rows[2:], torch.full((1, DIM), 3.0))  # row 2: once, with a large (noisy) gradient
    raw = g.chunks.importance[g.cmap[:3, 0]]
    shrunk = g.shrunk_importance()[0][g.cmap[:3, 0]]
    assert raw[2] > raw[0]  # its own sum says row 2 matters most
    assert shrunk[2] < shrunk[0]  # shrunk toward the table's mean, its single access counts for little
    g0 = PrunedGroup([TableConfig(name="t", dim=DIM, features=["t"])], PruneConfig(enabled=True, chunk=CHUNK, shrinkage=0.0))
    assert g0.count.size == 0  # no per-row count is kept without shrinkage
