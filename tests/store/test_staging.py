"""Reading ahead (TieredGroup.stage): lookups take rows read ahead only while they are the row's current record,
and training with any read-ahead window gives the numbers of training without one, compact cold rows included."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from tierec.embedding.table import TableConfig
from tierec.store.tiered_group import TieredGroup
from tierec.store.directory import LOC_DISK
from tierec.store.spec import Counter, TierSpec

DIM = 4
REC = 4 * (DIM + 1)


def _group(tmp_path, **kw) -> TieredGroup:
    spec = TierSpec(**{"cache_bytes": 8 * REC, "host_bytes": 0, "disk_dir": str(tmp_path), **kw})
    return TieredGroup([TableConfig(name="t", dim=DIM, features=["f"])], spec, seed=1)


def _look(g: TieredGroup, ids) -> torch.Tensor:
    keys = np.asarray(ids, dtype=np.int64)
    rows = g.lookup(keys, np.zeros(keys.size, dtype=np.int32), insert=True)
    g.update(rows, torch.full((keys.size, DIM), 0.5))  # every looked-up row changes: it is written back when evicted
    return rows


def _tabs(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.int32)


def test_a_lookup_takes_rows_read_ahead_and_reads_only_the_rest(tmp_path) -> None:
    g = _group(tmp_path)
    _look(g, np.arange(8))
    _look(g, np.arange(8, 16))  # ids 0..7 now live on disk only
    requests = g.disk.requests
    token = g.stage(np.arange(4, dtype=np.int64), _tabs(4))
    assert token is not None and g.staging.held_rows == 4
    _look(g, np.arange(6))  # 0..3 read ahead, 4 and 5 on demand
    assert int(g.counters[0, Counter.PREFETCHED]) == 4 and int(g.counters[0, Counter.DISK_READ_ROWS]) == 6
    assert g.disk.requests == requests + 2  # one request read 0..3 ahead (written together), one read 4 and 5
    g.release_staged(token)
    assert g.staging.held_rows == 0 and g.staging.stats.used_rows == 4
    g.close()


def test_a_lookup_starts_reading_its_rows_no_window_holds_before_it_evicts(tmp_path) -> None:
    """Of 6 rows on disk, 4 read ahead: the other 2 are read on the read-ahead threads from before the lookup's
    evictions (which then hide the reads), taken from there, and come up with their values."""
    g = _group(tmp_path)
    _look(g, np.arange(8))
    _look(g, np.arange(8, 16))  # ids 0..7 now live on disk only
    before = g.records_of(np.arange(6, dtype=np.int64), _tabs(6))[1]
    token = g.stage(np.arange(4, dtype=np.int64), _tabs(4))
    reading = []
    take_slots = g._take_slots

    def spy(n: int, best_effort: bool = False, ahead: bool = False) -> np.ndarray:
        reading.append(g.disk_rows.early.held_rows)  # the lookup's own reads, started already
        return take_slots(n, best_effort, ahead)

    g._take_slots = spy
    rows = g.lookup(np.arange(6, dtype=np.int64), _tabs(6), insert=True)
    assert reading == [2] and g.disk_rows.early.stats.staged_rows == 2 and g.disk_rows.early.held_rows == 0
    assert int(g.counters[0, Counter.PREFETCHED]) == 4 and int(g.counters[0, Counter.DISK_READ_ROWS]) == 6
    torch.testing.assert_close(g.weights[rows], torch.from_numpy(before[:, :DIM]), rtol=0, atol=0)
    g.release_staged(token)
    g.close()


def test_a_record_read_ahead_is_not_used_once_the_row_moved(tmp_path) -> None:
    g = _group(tmp_path)
    _look(g, np.arange(8))
    _look(g, np.arange(8, 16))
    token = g.stage(np.arange(4, dtype=np.int64), _tabs(4))
    _look(g, np.arange(4))  # 0..3 come up (taken from the window) and change
    _look(g, np.arange(16, 24))  # and go down again: new records at new homes
    before = g.records_of(np.arange(4, dtype=np.int64), _tabs(4))[1]
    used = int(g.counters[0, Counter.PREFETCHED])
    early = g.disk_rows.early.stats.staged_rows
    rows = g.lookup(np.arange(4, dtype=np.int64), _tabs(4), insert=True)  # the window holds old records: not taken
    assert int(g.counters[0, Counter.PREFETCHED]) == used
    assert g.disk_rows.early.stats.staged_rows == early + 4  # read from before the lookup evicted, as rows no window holds
    torch.testing.assert_close(g.weights[rows], torch.from_numpy(before[:, :DIM]) + 0.0, rtol=0, atol=0)
    g.release_staged(token)
    g.close()


def test_a_record_compaction_moves_is_still_taken_from_the_window(tmp_path) -> None:
    """Compaction moves records byte for byte: a window that read them before keeps them current, so the lookup
    takes them from there instead of reading them again (before: 8 early reads, none from the window)."""
    g = _group(tmp_path, disk_segment_rows=4, disk_max_ratio=1.01)
    for lo in (0, 8, 16):
        _look(g, np.arange(lo, lo + 8))
    staged = np.arange(16)
    lids = g.index.find(staged, _tabs(16))
    token = g.stage(staged.astype(np.int64), _tabs(16))
    g.staging._windows[token].read.result()  # read before any move
    home = g.index.home[lids].copy()
    _look(g, np.arange(0, 16, 3))  # these change (their window copies go stale), and leave holes on disk when sent down
    _look(g, np.arange(24, 32))
    _look(g, np.arange(32, 40))  # the lookups' compaction moved the others
    kept = (staged % 3 != 0) & (g.index.tier[lids] == LOC_DISK)
    moved = staged[kept & (g.index.home[lids] != home)][:8]
    assert moved.size == 8
    before = g.records_of(moved.astype(np.int64), _tabs(8))[1]
    taken, early = int(g.counters[0, Counter.PREFETCHED]), g.disk_rows.early.stats.staged_rows
    rows = g.lookup(moved.astype(np.int64), _tabs(8), insert=True)
    assert int(g.counters[0, Counter.PREFETCHED]) == taken + 8 and g.disk_rows.early.stats.staged_rows == early
    torch.testing.assert_close(g.weights[rows], torch.from_numpy(before[:, :DIM]), rtol=0, atol=0)
    g.release_staged(token)
    g.close()


def test_a_window_still_reading_when_compaction_began_does_not_follow_its_moves() -> None:
    """A read still running might find another record at a slot compaction freed: such a window keeps the old
    slots (its copies are then not current); one whose reads ended before follows."""
    from concurrent.futures import Future

    from tierec.store.disk import PendingRead
    from tierec.store.staging import Staging

    lids, slots, epochs = np.array([3, 5]), np.array([10, 11]), np.array([1, 1])
    st = Staging()
    read = PendingRead(None, slots, np.arange(2), np.zeros((2, 3), dtype=np.float32))
    running = Future()
    read.futures.append(running)
    st.add(lids, slots, epochs, read, np.full(2, -1))
    new_slots, new_epochs = np.array([40, 41]), np.array([2, 2])
    st.rehome(lids, new_slots, new_epochs, since=time.perf_counter())
    assert not st.current(lids, new_slots, new_epochs).any() and st.current(lids, slots, epochs).all()
    running.set_result(0)  # it had ended by then (finished: when it started)
    st.rehome(lids[1:], new_slots[1:], new_epochs[1:], since=time.perf_counter())
    assert st.current(lids, np.array([10, 41]), np.array([1, 2])).all()


def test_rows_not_on_disk_are_not_read_ahead(tmp_path) -> None:
    g = _group(tmp_path)
    _look(g, np.arange(8))
    assert g.stage(np.arange(8, dtype=np.int64), _tabs(8)) is None  # all in the fast tier
    assert g.stage(np.array([100, 101], dtype=np.int64), _tabs(2)) is None  # unknown ids
    g.close()


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("depth", [1, 3])
def test_training_with_a_read_ahead_window_equals_training_without(tmp_path, precision: str, depth: int) -> None:
    from tierec.config import load_config
    from tierec.train.trainer import Trainer

    base = ["data.synthetic.train_rows=12288", "data.synthetic.test_rows=2048", "train.batch_size=1024", "train.progress=false",
            "train.plots=false", "train.epochs=2", "embedding.dim=8", "store.enabled=true", "store.cache_size=192KiB", "store.host_size=64KiB",
            f"store.cold_precision={precision}"]
    out = {}
    for name, extra in (("off", []), ("on", ["store.prefetch=true", f"store.prefetch_depth={depth}"])):
        cfg = load_config(None, base + extra + [f"store.disk_path={tmp_path / name / 'disk'}"])
        out[name] = Trainer(cfg, tmp_path / name, echo=lambda _: None).fit()
    a, b = out["off"], out["on"]
    assert a["test_auc"] == b["test_auc"] and a["final_train_loss"] == b["final_train_loss"]
    assert b["store"]["disk_read_rows"] > 0 and b["store"]["pipeline"]["staged_rows"] > 0  # rows came from disk, some read ahead
    assert b["store"]["pipeline"]["resolved_batches"] > 0  # lookups started from their window's dedupe and probe


def test_the_windows_stay_within_their_share_of_the_budget(tmp_path) -> None:
    rec = 4 * (DIM + 2) + 33  # a disk record with its lid header, plus row, slot, epoch, until and flag
    g = _group(tmp_path, stage_bytes=3 * rec)
    _look(g, np.arange(8))
    _look(g, np.arange(8, 16))
    g.stage(np.arange(6, dtype=np.int64), _tabs(6))
    assert g.staging.held_rows == 3 and g.staging.nbytes() <= 3 * rec  # the earliest three, not more
    assert g.staging.stats.dropped_rows == 3
    g.close()


def test_the_budget_makes_room_for_the_windows() -> None:
    from tierec.config import load_config
    from tierec.store.plan import StorePlan

    def spec(*over: str):
        cfg = load_config(None, ["store.enabled=true", "store.memory_budget=64MiB", "store.disk_path=/tmp", *over])
        tables = [TableConfig(name="t", dim=DIM, features=["f"])]
        return StorePlan(cfg.store, [tables]).spec_for(tables)

    plain, ahead = spec("store.prefetch=false"), spec()  # on by default
    assert plain.cache_bytes == 32 << 20  # fp32 cold rows and a disk tier: the fast tier gets half the budget
    assert plain.stage_bytes is None and plain.host_bytes == 32 << 20
    assert ahead.stage_bytes == 16 << 20 and ahead.cache_bytes + ahead.host_bytes + ahead.stage_bytes == 64 << 20  # fp32: a quarter
    compact = spec("store.cold_precision=int8")
    assert compact.cache_bytes == 16 << 20  # compact rows: a quarter
    assert compact.stage_bytes == 8 << 20 and compact.host_bytes == 40 << 20  # an eighth
    no_disk = load_config(None, ["store.enabled=true", "store.memory_budget=64MiB"]).store
    tables = [TableConfig(name="t", dim=DIM, features=["f"])]
    assert StorePlan(no_disk, [tables]).spec_for(tables).cache_bytes == 16 << 20  # no disk tier: a quarter
    foreseen = spec("store.cold_precision=int8", "store.horizon=16")  # compact rows with a horizon: 3/8
    assert foreseen.stage_bytes == 24 << 20 and foreseen.host_bytes == 24 << 20
    big_cache = spec("store.cold_precision=int8", "store.horizon=16", "store.cache_size=48MiB")  # 3/4 of the rest
    assert big_cache.stage_bytes == 12 << 20 and big_cache.host_bytes == 4 << 20
    assert spec("store.horizon=16").stage_bytes == 16 << 20  # fp32 rows: a quarter, horizon or not
    full = spec("store.host_size=32MiB")  # sizes that leave nothing: no reading ahead
    assert full.stage_bytes == 0 and full.host_bytes == 32 << 20
    partial = spec("store.host_size=24MiB")
    assert partial.stage_bytes == 8 << 20


@pytest.mark.parametrize("budget, shorter, rows", [
    ("320KiB", True, []), ("16MiB", False, []),
    # int8 rows with a horizon: the stage on a thread of its own, a batch ahead of the step (where there are 2 cores)
    ("320KiB", True, ["store.cold_precision=int8", "store.horizon=4"]),
])
def test_windows_shorten_where_they_do_not_fit_and_change_no_number(tmp_path, budget: str, shorter: bool, rows: list[str]) -> None:
    from tierec.config import load_config
    from tierec.train.trainer import Trainer

    base = ["data.synthetic.train_rows=12288", "data.synthetic.test_rows=2048", "train.batch_size=1024", "train.progress=false",
            "train.plots=false", "train.epochs=3", "embedding.dim=8", "store.enabled=true", f"store.memory_budget={budget}",
            "store.cache_size=192KiB", *rows]
    out = {}
    for name, extra in (("off", ["store.prefetch=false"]), ("on", ["store.prefetch=true", "store.prefetch_depth=4"])):
        cfg = load_config(None, base + extra + [f"store.disk_path={tmp_path / name / 'disk'}"])
        out[name] = Trainer(cfg, tmp_path / name, echo=lambda _: None).fit()
    a, b = out["off"], out["on"]
    assert a["test_auc"] == b["test_auc"] and a["final_train_loss"] == b["final_train_loss"]
    pipe = b["store"]["pipeline"]
    assert (pipe["smallest_window"] < 4) is shorter  # a small budget: windows of fewer batches
    assert (pipe["released_early"] > 0) is shorter  # and each goes once its batches were looked up from it
    assert b["store"]["disk_read_rows"] > 0 or not shorter


class _Read:
    """A finished read of records [m, 1 + W] (the lid header first), as DiskTier.submit_read's PendingRead gives."""

    def __init__(self, rec: np.ndarray) -> None:
        self.rec, self.nbytes = rec, rec.nbytes

    def result(self) -> np.ndarray:
        return self.rec

    def cancel(self) -> None:
        pass


def test_take_finds_the_current_records_of_every_window_as_a_plain_search_does() -> None:
    from tierec.store.staging import Staging

    rng = np.random.default_rng(3)
    s, width, windows = Staging(), 3, []
    for w in range(3):
        lids = np.sort(rng.choice(200, 60, replace=False)).astype(np.int64)
        slots, epochs = rng.integers(0, 50, 60), rng.integers(0, 3, 60)
        rec = np.zeros((60, 1 + width), dtype=np.float32)
        rec[:, 0] = lids.astype(np.int32).view(np.float32)
        rec[:, 1:] = rng.random((60, width))
        until = rng.integers(0, 9, 60)
        s.add(lids, slots, epochs, _Read(rec), until)
        windows.append((lids, slots, epochs, rec, until))
    lids = rng.choice(220, 150, replace=False).astype(np.int64)
    slots, epochs = rng.integers(0, 50, 150), rng.integers(0, 3, 150)
    for i in range(0, 150, 3):  # a third surely current in some window
        w = windows[i % 3]
        j = i % 60
        lids[i], slots[i], epochs[i] = w[0][j], w[1][j], w[2][j]
    out, keep = np.full((150, width), -7.0, dtype=np.float32), np.full(150, -1, dtype=np.int64)
    found, header = s.take(lids, slots, epochs, out, keep)
    for i in range(150):  # reference: the newest window holding the row at that slot and epoch
        match = [(w, j) for w in reversed(windows) for j in np.flatnonzero(w[0] == lids[i])
                 if w[1][j] == slots[i] and w[2][j] == epochs[i]]
        assert found[i] == bool(match)
        if match:
            w, j = match[0]
            assert out[i].tolist() == w[3][j, 1:].tolist() and keep[i] == w[4][j] and header[i] == lids[i]
        else:
            assert out[i].tolist() == [-7.0] * width and keep[i] == -1 and header[i] == -1
    assert found[::3].all() and 0 < int(found.sum()) < 150


def test_a_record_read_ahead_that_is_not_the_row_written_there_is_an_error(tmp_path) -> None:
    from tierec.errors import DiskTierError

    g = _group(tmp_path)
    _look(g, np.arange(8))
    _look(g, np.arange(8, 16))  # ids 0..7 on disk
    lids = g.record_rows(np.array([1]), _tabs(1))
    other = os.open(f"/proc/self/fd/{g.disk.fd}", os.O_WRONLY)  # an outsider writes another row's id there
    os.pwrite(other, np.array([99], dtype=np.int32).tobytes(), int(g.index.home[lids][0]) * g.disk.rec_bytes)
    os.close(other)
    g.stage(np.arange(4, dtype=np.int64), _tabs(4))  # rows 0..3 read ahead, 1 with the bad header
    with pytest.raises(DiskTierError, match="holds row 99"):
        _look(g, np.arange(4))
    g.close()


def test_a_windows_bookkeeping_is_what_the_budget_counts_per_row() -> None:
    from tierec.store.staging import ROW_BOOKKEEPING, Staging

    s, n = Staging(), 1000
    rec = np.zeros((n, 1 + 7), dtype=np.float32)
    s.add(np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64), _Read(rec),
          np.full(n, -1, dtype=np.int64))
    assert s.nbytes() == rec.nbytes + n * ROW_BOOKKEEPING
    assert s.room(rec.nbytes + n * ROW_BOOKKEEPING + 10 * (32 + ROW_BOOKKEEPING), 32, 50) == 10  # 10 more rows fit


@pytest.mark.parametrize("m", [0, 1, 2, 3, 17, 1000, 40_001])
def test_lower_bounds_are_numpy_s_searchsorted(m: int) -> None:
    """The batched search (every lane count, duplicates, queries below, between, on and above the values)."""
    from tierec.store.sorted_search import find_sorted, lower_bounds

    rng = np.random.default_rng(m)
    a = np.sort(rng.integers(0, 3 * m + 5, m)).astype(np.int32)  # duplicates where m is large
    for n in (0, 1, 15, 16, 17, 5000):
        q = rng.integers(-2, 3 * m + 8, n)
        out = np.full(n, -7, dtype=np.int64)
        lower_bounds(a, q, out)
        assert out.tolist() == np.searchsorted(a, q).tolist()
        found, pos = find_sorted(a, q)  # membership and place, on top of it
        assert found.tolist() == np.isin(q, a).tolist() and np.array_equal(a[pos[found]], q[found])


def test_same_ids_is_equality_of_keys_and_tables() -> None:
    from tierec.store.staging import same_ids

    rng = np.random.default_rng(3)
    keys, tabs = rng.integers(0, 1 << 40, 1000), rng.integers(0, 26, 1000).astype(np.int32)
    assert same_ids(keys, tabs, keys.copy(), tabs.copy())
    for at in (0, 500, 999):
        k2, t2 = keys.copy(), tabs.copy()
        k2[at] += 1
        assert not same_ids(keys, tabs, k2, tabs)
        t2[at] += 1
        assert not same_ids(keys, tabs, keys, t2)
