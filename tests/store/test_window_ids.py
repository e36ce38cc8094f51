"""A read-ahead window's ids (Staging.resolve, TierStore.lookup's ``known``): a batch's unique pairs and lids come
from its window's dedupe and probe, and they equal the batch's own dedupe and probe, so the lookup is the same."""

from __future__ import annotations

import numpy as np
import torch

from tierec.embedding.hash_index import Deduper
from tierec.embedding.table import TableConfig
from tierec.store.tiered_group import TieredGroup
from tierec.store.spec import TierSpec
from tierec.store.staging import BatchIds, SeenBatch, compose_window

DIM = 4
REC = 4 * (DIM + 1)
TABLES = 3


def _group(tmp_path, name: str, horizon: int = 0) -> TieredGroup:
    spec = TierSpec(cache_bytes=160 * REC, host_bytes=48 * REC, disk_dir=str(tmp_path / name), horizon=horizon)
    tables = [TableConfig(name=f"t{i}", dim=DIM, features=[f"f{i}"]) for i in range(TABLES)]
    return TieredGroup(tables, spec, seed=1)


def _batch(rng: np.random.Generator, n: int, high: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids feature by feature (table t's ids, then t + 1's), with repeats, as a collection reads a batch."""
    keys = rng.zipf(1.3, n * TABLES).astype(np.int64) % high
    return keys, np.repeat(np.arange(TABLES, dtype=np.int32), n)


def _stage(g: TieredGroup, batches: list[tuple[np.ndarray, np.ndarray]]) -> int | None:
    """What StorePipeline.stage does: one dedupe of the window, each batch's positions among its pairs."""
    keys = np.concatenate([k for k, _ in batches])
    tabs = np.concatenate([t for _, t in batches])
    k, tb, inverse = Deduper()(keys, tabs)
    ends = np.cumsum([b[0].shape[0] for b in batches])[:-1]
    pos = np.split(inverse.astype(np.int32), ends)
    return g.stage(k, tb, np.ones(k.shape[0], dtype=np.int32), [BatchIds(b[0], b[1], p) for b, p in zip(batches, pos)])


def _train(g: TieredGroup, keys: np.ndarray, tabs: np.ndarray, resolve: bool) -> np.ndarray:
    """One training lookup and update of a batch; the batch's rows [n] (each id's fast-tier slot)."""
    known = g.resolve(keys, tabs) if resolve else None
    if known is None:
        uk, ut, inverse = Deduper()(keys, tabs)
        rows = g.lookup(uk, ut, insert=True)
    else:
        uk, ut, inverse = known.keys, known.tabs, known.inverse
        rows = g.lookup(uk, ut, insert=True, known=known)
    g.update(rows, torch.from_numpy(np.outer(uk % 7 - 3, np.ones(DIM)).astype(np.float32)))
    return rows.numpy()[inverse]


def test_a_resolved_batch_is_the_batch_dedupe_and_its_probe(tmp_path) -> None:
    g = _group(tmp_path, "g")
    rng = np.random.default_rng(0)
    for _ in range(4):  # rows in every tier
        _train(g, *_batch(rng, 64, 400), resolve=False)
    window = [_batch(rng, 64, 800) for _ in range(3)]  # ids never seen among them
    token = _stage(g, window)
    assert token is not None
    bounds = np.array([0, 64, 128, 192], dtype=np.int64)  # one table per feature: the collection's split dedupe
    for keys, tabs in window:
        r = g.resolve(keys, tabs)
        for uk, ut, inverse in (Deduper()(keys, tabs), Deduper()(keys, tabs, bounds)):
            assert np.array_equal(r.keys, uk) and np.array_equal(r.tabs, ut) and np.array_equal(r.inverse, inverse)
        assert np.array_equal(r.lids, g.index.find(r.keys, r.tabs))  # nothing trained since the window's probe
        assert (r.lids < 0).any() and (r.lids >= 0).any()
    assert g.resolve(*window[0]) is None  # each batch once
    other = _batch(rng, 64, 800)
    assert g.resolve(*other) is None  # not in the window
    assert g.staging.stats.resolved_batches == 3
    g.release_staged(token)
    assert g.resolve(*window[1]) is None
    g.close()


def test_a_window_goes_early_only_once_each_of_its_batches_was_looked_up_from_it(tmp_path) -> None:
    """release_looked_up drops a window once every batch of it was resolved and its lookup done (not at the
    resolve: the lookup still reads the window's records); a window without batches never; a later release of
    the token does nothing."""
    g = _group(tmp_path, "g")
    rng = np.random.default_rng(3)
    for _ in range(6):  # rows on disk
        _train(g, *_batch(rng, 64, 400), resolve=False)
    window = [_batch(rng, 64, 400) for _ in range(2)]
    token = _stage(g, window)
    reads_only = g.stage(*_stage_args(window))  # the same rows, no batches: nothing for it to know
    assert token is not None and g.staging.held_rows > 0
    assert not g.release_looked_up(token)
    known = g.resolve(*window[0])
    assert known is not None and not g.release_looked_up(token)  # resolved, not looked up
    uk, ut = known.keys, known.tabs
    g.lookup(uk, ut, insert=True, known=known)
    assert not g.release_looked_up(token)  # its second batch is still to come
    _train(g, *window[1], resolve=True)
    held = g.staging.held_rows
    assert g.release_looked_up(token)
    assert g.staging.held_rows < held and not g.release_looked_up(token)
    g.release_staged(token)  # gone already: nothing
    if reads_only is not None:
        assert not g.release_looked_up(reads_only)
        g.release_staged(reads_only)
    assert g.staging.held_rows == 0
    g.close()


def test_lookups_from_the_window_equal_lookups_that_probe(tmp_path) -> None:
    """Two groups train the same batches; one resolves them from read-ahead windows. Between a window's probe and
    its batches' lookups, earlier batches insert ids and move rows between tiers, and rows are deleted (the
    window's lids are then not used): slots, rows and values stay equal."""
    a, b = _group(tmp_path, "a"), _group(tmp_path, "b")
    rng = np.random.default_rng(1)
    batches = [_batch(rng, 48, 300 + 60 * i) for i in range(12)]
    tokens = []
    for i in range(0, len(batches), 3):
        tokens.append(_stage(b, batches[i : i + 3]))
        a.stage(*_stage_args(batches[i : i + 3]))  # the same reads ahead, no ids
        for j, (keys, tabs) in enumerate(batches[i : i + 3]):
            if i == 6 and j == 1:  # a deletion between the window's probe and this lookup
                gone = Deduper()(keys[:5], tabs[:5])[:2]
                a.delete_records(*gone)
                b.delete_records(*gone)
            assert np.array_equal(_train(a, keys, tabs, resolve=False), _train(b, keys, tabs, resolve=True))
    assert b.staging.stats.resolved_batches == len(batches)
    keys = np.arange(1000, dtype=np.int64)
    for t in range(TABLES):
        tabs = np.full(keys.size, t, dtype=np.int32)
        fa, ra = a.records_of(keys, tabs)
        fb, rb = b.records_of(keys, tabs)
        assert np.array_equal(fa, fb) and np.array_equal(ra, rb)
    a.release_staged()
    b.release_staged()
    a.close()
    b.close()


def _stage_args(batches: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    k, tb, _ = Deduper()(np.concatenate([x for x, _ in batches]), np.concatenate([t for _, t in batches]))
    return k, tb, np.ones(k.shape[0], dtype=np.int32)


def _seen(g: TieredGroup, keys: np.ndarray, tabs: np.ndarray) -> SeenBatch:
    """What StorePipeline.foresee keeps of a batch: its own dedupe and the lids the horizon's look found."""
    uk, ut, inverse = Deduper()(keys, tabs)
    return SeenBatch(uk, ut, inverse.astype(np.int32), g.foresee(uk, ut))


def test_a_window_composed_from_its_foreseen_batches_is_the_windows_own_dedupe_and_probe(tmp_path) -> None:
    """With a horizon the window starts from its batches' dedupes and lids: the same pairs and positions as one
    dedupe of the window, and the same lids as a probe at staging, also for pairs that got a row after their
    batch was foreseen; after a deletion the window probes every pair again."""
    g = _group(tmp_path, "g", horizon=8)
    rng = np.random.default_rng(2)
    for _ in range(4):  # rows in every tier
        _train(g, *_batch(rng, 64, 400), resolve=False)
    window = [_batch(rng, 64, 800) for _ in range(3)]  # ids never seen among them
    seen = [_seen(g, *b) for b in window]
    keys, tabs = np.concatenate([k for k, _ in window]), np.concatenate([t for _, t in window])
    _train(g, keys[::3].copy(), tabs[::3].copy(), resolve=False)  # rows for some of them, after their foresee
    k, tb, pos, found = compose_window(seen, Deduper())
    uk, ut, inverse = Deduper()(keys, tabs)
    assert np.array_equal(k, uk) and np.array_equal(tb, ut)
    assert np.array_equal(np.concatenate(pos), inverse)
    now = g.index.find(k, tb)
    known = found.lids >= 0
    assert np.array_equal(found.lids[known], now[known])
    assert ((found.lids < 0) & (now >= 0)).any()  # made after the foresee: probed again below
    token = g.stage(k, tb, np.ones(k.shape[0], dtype=np.int32), [BatchIds(*b, p) for b, p in zip(window, pos)], found)
    for b in window:
        r = g.resolve(*b)
        assert np.array_equal(r.lids, g.index.find(r.keys, r.tabs))
    g.release_staged(token)
    seen = [_seen(g, *b) for b in window]
    gone = Deduper()(keys[:5], tabs[:5])[:2]
    assert (g.index.find(*gone) >= 0).any()  # rows made above, foreseen with their lids
    g.delete_records(*gone)
    k, tb, pos, found = compose_window(seen, Deduper())
    assert found.deletions != g.index.deletions  # stale: stage probes every pair
    token = g.stage(k, tb, np.ones(k.shape[0], dtype=np.int32), [BatchIds(*b, p) for b, p in zip(window, pos)], found)
    for b in window:
        r = g.resolve(*b)
        assert np.array_equal(r.lids, g.index.find(r.keys, r.tabs))  # the deleted pairs' stale lids not used
    g.release_staged()
    g.close()
