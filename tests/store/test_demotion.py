"""Which host rows go to disk: the bucket queue kept across lookups (tierec/store/demotion.py) against ranking
every host row at each call."""

from __future__ import annotations

import numpy as np

from tierec.store.demotion import GARBAGE, RANKED_FROM, ColdHostRows
from tierec.store.directory import LOC_DISK, LOC_HOST, LOC_NONE, Directory
from tierec.store.hotness import BEFORE_ALL


class _Uses:
    """The three calls ColdHostRows makes of a Horizon, over a plain array of next uses."""

    def __init__(self, next_at: np.ndarray, length: int) -> None:
        self.next_at, self.length, self.active = next_at, length, length > 0

    def uses(self, step: int):
        return (self.next_at, step, step + self.length) if self.active else None

    def _at(self, lids: np.ndarray) -> np.ndarray:  # rows past the array: never foreseen
        inside = lids < self.next_at.size
        return np.where(inside, self.next_at[np.where(inside, lids, 0)], 0)

    def next_use(self, lids: np.ndarray, step: int) -> np.ndarray:
        t = self._at(lids)
        return np.where((t > step) & (t <= step + self.length), t, 0)

    def ranked(self, score: np.ndarray, lids: np.ndarray, step: int) -> np.ndarray:
        t = self._at(lids)
        inside = (t > step) & (t <= step + self.length)
        return np.where(inside, BEFORE_ALL - t, score)


def _reference(d: Directory, uses: _Uses, n: int, need: int, step: int, by_horizon: bool) -> np.ndarray:
    """Ranks of the ``need`` lowest-ranked host rows, from every host row (by counts: those the horizon uses
    never leave)."""
    host = np.flatnonzero(d.tier[:n] == LOC_HOST)
    r = d.freq[host].astype(np.float64)
    if by_horizon:
        r = uses.ranked(r, host, step)
    else:
        r[uses.next_use(host, step) > 0] = np.inf
    return np.sort(r)[:need]


def _run(length: int, seed: int, host_rows: int = 1600) -> None:
    g = np.random.default_rng(seed)
    n, need = 3000, 40
    d = Directory()
    lids = d.insert(np.arange(n), np.zeros(n, dtype=np.int32))
    d.freq[lids] = g.integers(0, 50, n).astype(np.float32)
    d.loc[lids] = LOC_HOST
    d.loc[lids[g.random(n) < 0.3]] = LOC_DISK
    next_at = g.integers(1, 400, n).astype(np.int32)
    uses = _Uses(next_at, length)
    cold = ColdHostRows(d, uses, host_rows)
    by_horizon = host_rows >= RANKED_FROM * need
    for step in range(1, 120):
        # rows used at this step leave the host (for the fast tier) and get their next use
        used = np.flatnonzero(next_at == step)
        d.loc[used[d.tier[used] == LOC_HOST]] = LOC_NONE
        next_at[used] = step + g.integers(1, 300, used.size)
        got, ranks = cold.candidates(need, step)
        assert np.all(d.tier[got] == LOC_HOST) and np.unique(got).size == got.size
        want = _reference(d, uses, n, need, step, by_horizon)
        if by_horizon:
            assert np.array_equal(np.sort(ranks), want), step
        else:  # by counts: none the horizon uses
            assert np.all(np.isfinite(ranks)) and not np.any(uses.next_use(got, step) > 0), step
            assert np.array_equal(np.sort(ranks), want[: ranks.size]) and np.isfinite(want[: ranks.size]).all(), step
        d.loc[got[: need // 2]] = LOC_DISK  # half of them demoted
        # rows come to the host: some from disk, the ones used at this step
        on_disk = np.flatnonzero(d.tier[:n] == LOC_DISK)
        back = np.concatenate([g.choice(on_disk, min(15, on_disk.size), replace=False), used[d.tier[used] == LOC_NONE]])
        d.loc[back] = LOC_HOST
        cold.came(back, step)
        if step % 50 == 0:  # a hotness pass: counts decay
            d.freq[lids] = d.freq[lids] * np.float32(0.9)
            cold.forget()


def test_the_list_gives_the_lowest_ranked_host_rows_with_a_horizon() -> None:
    _run(length=64, seed=1)


def test_a_small_host_demotes_by_counts_and_keeps_the_rows_the_horizon_uses() -> None:
    _run(length=64, seed=3, host_rows=800)


def test_a_queue_made_anew_orders_like_a_sort_of_every_row_ties_by_lid() -> None:
    """Rows in the fast tier are homed on the host or disk too, but not away: never candidates."""
    g = np.random.default_rng(2)
    n = 5000
    for k in (1, 100, 4000):
        d = Directory()
        lids = d.insert(np.arange(n), np.zeros(n, dtype=np.int32))
        d.freq[lids] = g.integers(0, 1000, n).astype(np.float32)
        d.loc[lids] = np.where(g.random(n) < 0.5, LOC_HOST, LOC_DISK).astype(np.int8)
        up = g.choice(n, 300, replace=False)
        d.attach_cache(301)
        d.come_up(lids[up], np.arange(1, 301), d.loc[lids[up]], d.home[lids[up]])
        next_at = g.integers(0, 200, n - 700).astype(np.int32)  # the last 700 rows never foreseen
        uses = _Uses(next_at, 64)
        host = np.flatnonzero(d.tier[:n] == LOC_HOST)
        assert 0 < host.size < n // 2 - 100
        got, ranks = ColdHostRows(d, uses, None).candidates(k, 50)
        r = uses.ranked(d.freq[host].astype(np.float64), host, 50)
        want = host[np.lexsort((host, r))][:k]
        assert np.array_equal(got, want) and np.array_equal(ranks, np.sort(r)[:k])
        assert np.array_equal(d.tier[:n] == LOC_HOST, np.isin(np.arange(n), host))  # the walk's marks are gone


def test_rows_listed_twice_are_taken_once_and_the_queue_is_made_anew_when_mostly_gone() -> None:
    """A row that leaves the host and comes back is listed twice: a walk takes it once. Rows that come and go
    fill the queue with entries of rows gone: past GARBAGE times the rows it was made with, it is made anew,
    and what it gives stays the lowest-ranked host rows."""
    n, need = 500, 50
    d = Directory()
    lids = d.insert(np.arange(n), np.zeros(n, dtype=np.int32))
    d.freq[lids] = np.arange(n, dtype=np.float32) % 37
    d.loc[lids] = LOC_HOST
    uses = _Uses(np.zeros(n, dtype=np.int32), 0)
    cold = ColdHostRows(d, uses, None)
    cold.candidates(need, 1)  # made: every row listed once
    made = cold._queue
    g = np.random.default_rng(5)
    for step in range(2, 40):
        back = g.choice(n, 60, replace=False)
        d.loc[back] = LOC_NONE
        d.loc[back] = LOC_HOST
        cold.came(back, step)  # listed again
        got, ranks = cold.candidates(need, step)
        assert np.unique(got).size == got.size == need
        assert np.array_equal(ranks, _reference(d, uses, n, need, step, False))
    assert cold._queue is not made and cold._queue.used <= GARBAGE * n


REC = 4 * (4 + 1)  # a row of dim 4 and its row-wise Adagrad state, in bytes


def _tiered(tmp_path, cold: str = "fp32"):
    from tierec.embedding.table import TableConfig
    from tierec.store.tiered_group import TieredGroup
    from tierec.store.spec import ColdPrecision, TierSpec

    spec = TierSpec(cache_bytes=8 * REC, host_bytes=16 * REC, disk_dir=str(tmp_path), in_flight=2,
                    cold_precision=ColdPrecision(cold))
    return TieredGroup([TableConfig(name="t", dim=4, features=["f"])], spec, seed=0)


def _look(g, keys) -> None:
    keys = np.asarray(keys, dtype=np.int64)
    g.lookup(keys, np.zeros(keys.size, dtype=np.int32), insert=True)


def test_rows_sent_down_take_the_host_slots_of_the_rows_a_lookup_brings_up(tmp_path) -> None:
    """The host is full; a lookup brings 8 rows up from it and sends the fast tier's 8 down: they take those
    host slots, none goes to disk, and every row keeps its values."""
    from tierec.store.spec import Counter

    g = _tiered(tmp_path)
    for k in range(0, 24, 8):  # rows 0-15 end on the host, 16-23 in the fast tier
        _look(g, np.arange(k, k + 8))
    assert g.host.free_rows == 0
    keys = np.arange(24)
    before = g.records_of(keys, np.zeros(24, dtype=np.int32))[1]
    writes = g.counters[:, Counter.DISK_WRITE_ROWS].sum()
    _look(g, np.arange(8))  # from the host
    assert g.counters[:, Counter.DISK_WRITE_ROWS].sum() == writes  # the rows sent down took the freed slots
    found, after = g.records_of(keys, np.zeros(24, dtype=np.int32))
    assert found.all() and np.array_equal(after, before)
    g.close()


def test_a_lookup_that_finds_no_room_leaves_its_host_rows_where_they_were(tmp_path) -> None:
    """With compact rows the last two lookups' rows stay pinned, so a lookup of 8 host rows finds 4 slots to
    free: it fails with CacheCapacityError after reading its host rows, which go back to the host with their
    values."""
    import pytest

    from tierec.store.group import CacheCapacityError

    g = _tiered(tmp_path, "int8")
    for k in range(0, 16, 4):
        _look(g, np.arange(k, k + 4))  # rows 0-7 end on the host, 8-15 in the fast tier
    keys = np.arange(16)
    before = g.records_of(keys, np.zeros(16, dtype=np.int32))[1]
    used = g.host.used
    with pytest.raises(CacheCapacityError):
        _look(g, np.arange(8))
    assert g.host.used == used
    found, after = g.records_of(keys, np.zeros(16, dtype=np.int32))
    assert found.all() and np.array_equal(after, before)
    g.close()


def test_a_head_of_risen_rows_many_times_over_still_gives_the_lowest() -> None:
    """The list's first 400 rows all gain a foreseen use after it was made: each head the call looks at is all
    risen rows, more times than it moves them; what it returns is still the lowest-ranked host rows, with their
    ranks now."""
    n, need = 2000, 20
    d = Directory()
    lids = d.insert(np.arange(n), np.zeros(n, dtype=np.int32))
    d.freq[lids] = np.arange(n, dtype=np.float32)  # row i has count i: the list starts 0, 1, 2, ...
    d.loc[lids] = LOC_HOST
    next_at = np.zeros(n, dtype=np.int32)
    uses = _Uses(next_at, 64)
    cold = ColdHostRows(d, uses, 8 * (n + 1))  # each ranking takes all n rows: none left out
    cold.candidates(need, 1)  # ranked: no row is foreseen yet
    next_at[:400] = 50  # now the 400 coldest are used at step 50
    got, ranks = cold.candidates(need, 10)
    assert np.array_equal(np.sort(ranks), _reference(d, uses, n, need, 10, True))
    assert np.array_equal(np.sort(got), np.arange(400, 400 + need))
