"""Admission, eviction (LFU over capacity, time-to-live), hotness promotion and the prefetch pins."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from store_helpers import batches, by_id, collection, train

from tierec.embedding import TableConfig
from tierec.store import TieredGroup, TierSpec

DIM = 4
REC = 4 * (DIM + 1)


def _group(tmp_path, **kw) -> TieredGroup:
    spec = TierSpec(**{"cache_bytes": 64 * REC, "host_bytes": 0, "disk_dir": str(tmp_path), **kw})
    return TieredGroup([TableConfig(name="t", dim=DIM, features=["f"])], spec, seed=1)


def _look(g: TieredGroup, ids, insert: bool = True) -> np.ndarray:
    keys = np.asarray(ids, dtype=np.int64)
    return g.lookup(keys, np.zeros(keys.size, dtype=np.int32), insert).numpy()


def _init_of(ids) -> torch.Tensor:
    """The deterministic initial rows of ``ids`` (what a fresh plain group gives them)."""
    from tierec.embedding import TableGroup

    g = TableGroup([TableConfig(name="t", dim=DIM, features=["f"])], seed=1)
    rows = g.lookup(np.asarray(ids, dtype=np.int64), np.zeros(len(ids), dtype=np.int32), insert=True)
    return g.weights[rows]


def test_admission_after_k_sightings(tmp_path) -> None:
    g = _group(tmp_path, admit_after=3)
    for _ in range(2):
        rows = _look(g, [5, 6])
        assert rows.tolist() == [0, 0]  # the shared zero row
        g.update(torch.from_numpy(rows), torch.ones(2, DIM))  # no update reaches it
    assert g.num_rows == 0 and torch.equal(g.weights[0], torch.zeros(DIM))
    assert _look(g, [5], insert=False).tolist() == [-1]  # evaluation: unknown, reads zeros
    rows = _look(g, [5, 7])
    assert rows[0] > 0 and rows[1] == 0 and g.num_rows == 1
    assert torch.equal(g.weights[rows[0]], _init_of([5])[0])  # initialised like any new row
    st = g.stats()["t"]
    assert st["new"] == 1 and st["rejected"] == 5
    g.close()


def test_admission_by_probability_is_reproducible(tmp_path) -> None:
    ids = np.arange(2000)
    a, b = (_group(tmp_path, admit_probability=0.25, cache_bytes=1000 * REC) for _ in range(2))
    ra, rb = _look(a, ids), _look(b, ids)
    assert np.array_equal(ra > 0, rb > 0)
    assert 0.2 < (ra > 0).mean() < 0.3
    a.close()
    b.close()


def test_admission_in_training_matches_zero_reads() -> None:
    """A collection with admission trains; the rows it has match a plain run on admitted ids only."""
    coll = collection(TierSpec(cache_bytes=400 * 4 * 9, admit_after=2))
    data = batches(6, batch=32)
    train(coll, data)
    g = coll.groups[0]
    assert torch.equal(g.weights[0], torch.zeros(g.dim))
    st = g.stats()
    assert sum(s["rejected"] for s in st.values()) > 0 and g.num_rows > 0


def test_lfu_deletes_the_least_used_rows_over_capacity(tmp_path) -> None:
    g = _group(tmp_path, max_rows=20, interval=5, decay=1.0, cache_bytes=16 * REC)
    _look(g, np.arange(15))  # steps 1, 2: ids 0..29 once each
    _look(g, np.arange(15, 30))
    for _ in range(2):  # steps 3, 4: ids 0..9 twice more
        _look(g, np.arange(10))
    assert g.num_rows == 30 and g.disk.live_rows > 0
    _look(g, [100])  # step 5: the pass runs first, deleting 10 of the once-seen ids
    assert g.num_rows == 21  # 20 kept + id 100
    kept = _look(g, np.arange(10), insert=False)
    assert (kept >= 0).all()  # the hot ids survived
    known = (_look(g, np.arange(10, 30), insert=False) >= 0).sum()
    assert known == 10  # ten of the twenty once-seen ids are gone
    assert g.stats()["t"]["deleted_lfu"] == 10
    assert g.index.num_rows == 21 and g.disk.live_rows <= 21
    g.close()


def test_ttl_deletes_rows_unseen_for_t_steps_and_they_restart_fresh(tmp_path) -> None:
    g = _group(tmp_path, ttl_steps=3, interval=1)
    rows = _look(g, [1, 2])
    g.update(torch.from_numpy(rows), torch.ones(2, DIM))  # row 1 and 2 move away from their init
    for _ in range(4):
        _look(g, [2])
    assert _look(g, [1], insert=False).tolist() == [-1]  # deleted after 3 steps unseen
    assert _look(g, [2], insert=False)[0] >= 0
    st = g.stats()["t"]
    assert st["deleted_ttl"] == 1 and g.num_rows == 1
    again = _look(g, [1])
    assert torch.equal(g.weights[again[0]], _init_of([1])[0])  # a fresh row: initial weights
    assert float(g.state["sum"][again[0]]) == 0.0  # and fresh optimizer state
    g.close()


def test_hotness_promotes_hot_rows_after_a_restart(tmp_path) -> None:
    spec = TierSpec(cache_bytes=200 * 4 * 9, host_bytes=100 * 4 * 9, disk_dir=str(tmp_path), promote_max=50, interval=2)
    coll = collection(spec)
    train(coll, batches(10, batch=32))
    fresh = collection(spec)
    fresh.load_state_dict(coll.state_dict())  # rows land in host, then disk; the cache is empty
    g = fresh.groups[0]
    assert sum(s["rows_cache"] for s in g.stats().values()) == 0
    train(fresh, batches(2, batch=32, seed=5), start=10)  # the pass at step 12 promotes
    st = g.stats()
    assert sum(s["promoted"] for s in st.values()) > 0
    hottest = g.index.live()[np.argsort(-g.index.freq[g.index.live()])[:20]]
    assert (g.index.cslot[hottest] >= 0).mean() > 0.8  # the hottest rows are in the fast tier
    # Promotion only moves rows: the same numbers as without it.
    ref = collection(TierSpec(cache_bytes=200 * 4 * 9, host_bytes=100 * 4 * 9, disk_dir=str(tmp_path)))
    ref.load_state_dict(coll.state_dict())
    train(ref, batches(2, batch=32, seed=5), start=10)
    a, b = by_id(ref), by_id(fresh)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_stats_count_hits_misses_and_disk_bytes(tmp_path) -> None:
    g = _group(tmp_path, cache_bytes=4 * REC)
    _look(g, [1, 2, 3, 4])
    _look(g, [5, 6, 7, 8])  # evicts 1..4 to disk
    _look(g, [1, 2, 5, 6])  # 2 misses (from disk), 2 hits
    st = g.stats()["t"]
    assert (st["hits"], st["misses"], st["new"], st["evicted"]) == (2, 2, 8, 6)
    assert st["disk_read_rows"] == 2 and st["disk_read_bytes"] == 2 * g.disk.rec_bytes
    assert st["hit_rate"] == pytest.approx(2 / 12)
    assert st["rows_cache"] == 4 and st["rows_disk"] == 6
    g.close()


def test_a_lookup_with_few_misses_evicts_for_the_next_ones_and_rows_keep_their_values(tmp_path) -> None:
    """240 fast-tier rows: a lookup of 5 new rows into a full tier evicts them and a twelfth of the tier more
    (group.EVICT_AHEAD), so the next four such lookups evict nothing; one of 15 new rows (more than half that
    share) evicts only a 128th more. Every row evicted early comes back with its trained value: the same
    values as a group that holds every row."""
    from tierec.store.group import EVICT_AHEAD
    from tierec.store.spec import Counter

    g = _group(tmp_path, cache_bytes=240 * REC)
    ref = _group(tmp_path / "ref", cache_bytes=1000 * REC)
    room = int(g.capacity * EVICT_AHEAD)
    assert g.capacity == 240 and room == 20

    def look(ids) -> int:  # rows evicted by this lookup
        before = int(g.counters[0, Counter.EVICTED])
        grad = 0.25 * torch.from_numpy(np.asarray(ids, dtype=np.float32) % 3 + 1)[:, None].expand(-1, DIM)
        for s in (g, ref):
            rows = _look(s, ids)
            s.update(torch.from_numpy(rows), grad)
        return int(g.counters[0, Counter.EVICTED]) - before

    next_id = 0
    while g.fast.n_free >= 10:  # fill the tier
        assert look(np.arange(next_id, next_id + 10)) == 0
        next_id += 10
    free = g.fast.n_free
    assert look(np.arange(next_id, next_id + 5)) == 5 - free + room  # its shortfall and the room for the next ones
    next_id += 5
    assert [look(np.arange(next_id + 5 * i, next_id + 5 * i + 5)) for i in range(4)] == [0, 0, 0, 0]
    next_id += 20
    assert g.fast.n_free == 0
    assert look(np.arange(next_id, next_id + 15)) == 15 + max(int(g.capacity / 128), 1)  # 2 x 15 > room
    next_id += 15
    ids = np.arange(next_id)
    for s in (g, ref):
        assert bool(s.records_of(ids, np.zeros(ids.size, dtype=np.int32))[0].all())
    torch.testing.assert_close(
        torch.from_numpy(g.records_of(ids, np.zeros(ids.size, dtype=np.int32))[1]),
        torch.from_numpy(ref.records_of(ids, np.zeros(ids.size, dtype=np.int32))[1]), rtol=0, atol=0,
    )
    g.close()
    ref.close()
