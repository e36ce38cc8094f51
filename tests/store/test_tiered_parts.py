"""The store's parts on their own: sizes, the deletable directory, the host and disk tiers, the sketch."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tierec.config import ConfigError
from tierec.errors import DiskTierError
from tierec.store.directory import Directory
from tierec.store.disk import DiskTier
from tierec.store.hotness import BEFORE_ALL, CountMinSketch, coldest_evictable, evictable, lowest
from tierec.store.host import HostTier
from tierec.store.sizes import parse_size
from tierec.embedding.storage import whole_table_state


def test_parse_size() -> None:
    assert parse_size("2GiB") == 2 << 30
    assert parse_size("2 gb") == 2 * 10**9
    assert parse_size("1.5m") == 3 << 19
    assert parse_size("4096") == 4096 and parse_size(12) == 12
    assert parse_size("") is None
    for bad in ("2 parsecs", "-1", "GiB", True):
        with pytest.raises(ConfigError):
            parse_size(bad)


@pytest.mark.parametrize("tagged_lids", [None, 0, 100])
def test_directory_matches_a_dict_under_inserts_and_deletes(tagged_lids, monkeypatch) -> None:
    """Slots keep hash bits above the lid while lids fit (None: the default bound), bare lids beyond (0: from the
    start; 100: tagged until the directory grows past 100 lids, then rebuilt bare)."""
    from tierec.store import directory

    if tagged_lids is not None:
        monkeypatch.setattr(directory, "TAGGED_LIDS", tagged_lids)
    g = np.random.default_rng(0)
    d = Directory(initial_rows=8)
    widths = {d.tag_bits}
    ref: dict[tuple[int, int], int] = {}
    for _ in range(60):
        keys = np.unique(g.integers(0, 300, size=40))
        tabs = (keys % 3).astype(np.int32)
        lids = d.find(keys, tabs)
        for k, t, lid in zip(keys, tabs, lids):
            assert lid == ref.get((int(t), int(k)), -1)
        new = lids < 0
        for k, t, lid in zip(keys[new], tabs[new], d.insert(keys[new], tabs[new])):
            ref[(int(t), int(k))] = int(lid)
        if ref:  # delete a random third of the known rows
            items = list(ref.items())
            pick = g.choice(len(items), size=len(items) // 3, replace=False)
            d.delete(np.array([items[i][1] for i in pick], dtype=np.int64))
            for i in pick:
                del ref[items[i][0]]
        assert d.num_rows == len(ref)
        assert sorted(d.live().tolist()) == sorted(ref.values())
        widths.add(d.tag_bits)
    assert d.high < 300  # freed lids are reused
    assert widths == {None: {directory.TAG_BITS}, 0: {0}, 100: {directory.TAG_BITS, 0}}[tagged_lids]


def test_probe_equals_find_then_the_columns() -> None:
    """The fused probe gives what find and the per-lid columns give, for resident, away and unknown pairs."""
    from tierec.store.directory import LOC_DISK, LOC_HOST

    rng = np.random.default_rng(5)
    d = Directory(n_tables=3, cache_slots=300)
    n = 4000
    keys, tabs = rng.permutation(n * 2)[:n].astype(np.int64), rng.integers(0, 3, n).astype(np.int32)
    lids = d.insert(keys, tabs)
    d.loc[lids] = rng.choice([LOC_HOST, LOC_DISK], n).astype(np.int8)
    d.home[lids] = rng.permutation(n)
    d.come_up(lids[:250], np.arange(1, 251), d.loc[lids[:250]], d.home[lids[:250]])
    ask_k = np.concatenate([keys, keys + n * 2])  # the second half is unknown
    ask_t = np.concatenate([tabs, tabs])
    got = d.probe(ask_k, ask_t)
    ref = d.find(ask_k, ask_t)
    known = ref >= 0
    assert got[0].tolist() == ref.tolist() and known.sum() == n
    assert got[1][known].tolist() == d.cslot[ref[known]].tolist() and (got[1][~known] == -1).all()
    assert got[2][known].tolist() == d.loc[ref[known]].tolist() and (got[2][~known] == 0).all()
    assert got[3][known].tolist() == d.home[ref[known]].tolist() and (got[3][~known] == -1).all()
    assert (got[1][:250] >= 1).all() and (got[1][250:n] == -1).all()


def test_where_gives_each_lids_columns_as_the_directory_reads_them_one_by_one() -> None:
    """``where`` (its kernel asks for lids' entries ahead) is the per-lid columns, for resident, away and -1."""
    from tierec.store.directory import LOC_DISK, LOC_HOST, LOC_NONE

    rng = np.random.default_rng(9)
    d = Directory(n_tables=2, cache_slots=900)
    n = 6000
    lids = d.insert(rng.permutation(n * 3)[:n].astype(np.int64), rng.integers(0, 2, n).astype(np.int32))
    d.loc[lids] = rng.choice([LOC_NONE, LOC_HOST, LOC_DISK], n).astype(np.int8)
    d.home[lids] = rng.permutation(n)
    up = rng.choice(n, 899, replace=False)
    d.come_up(lids[up], rng.permutation(np.arange(1, 900)), d.loc[lids[up]], d.home[lids[up]])
    ask = rng.permutation(np.concatenate([lids, lids[:500], np.full(300, -1)]))  # repeats and unknowns
    got_lids, cs, loc, home = d.where(ask)
    known = ask >= 0
    assert got_lids.tolist() == ask.tolist()
    assert cs[known].tolist() == d.cslot[ask[known]].tolist() and (cs[~known] == -1).all()  # the columns' own reads
    assert loc[known].tolist() == d.loc[ask[known]].tolist() and (loc[~known] == LOC_NONE).all()
    assert home[known].tolist() == d.home[ask[known]].tolist() and (home[~known] == -1).all()
    assert (cs >= 1).sum() == np.isin(ask, lids[up]).sum() > 899  # every resident one, repeats too


def test_split_known_is_where_filtered_and_known_lids_is_probe_known() -> None:
    """A read-ahead window's one pass (``split_known``) gives the positions and homes of the rows away on disk
    and the positions and slots of the resident rows that ``where`` gives, in order, skipping -1; and
    ``known_lids`` the lids of ``probe_known``, with and without a deletion since the first probe."""
    from tierec.store.directory import LOC_DISK, LOC_HOST, LOC_NONE

    rng = np.random.default_rng(8)
    d = Directory(n_tables=3, cache_slots=600)
    n = 5000
    keys, tabs = rng.permutation(n * 2)[:n].astype(np.int64), rng.integers(0, 3, n).astype(np.int32)
    lids = d.insert(keys, tabs)
    d.loc[lids] = rng.choice([LOC_NONE, LOC_HOST, LOC_DISK], n).astype(np.int8)
    d.home[lids] = rng.permutation(n)
    up = rng.choice(n, 599, replace=False)
    d.come_up(lids[up], np.arange(1, 600), d.loc[lids[up]], d.home[lids[up]])  # some of them homed on disk too
    ask = rng.permutation(np.concatenate([lids, np.full(700, -1)]))  # unknown pairs among them
    _, cs, loc, home = d.where(ask)
    on_disk, disk_home, in_fast, fast_slot = d.split_known(ask)
    want_disk = np.flatnonzero((ask >= 0) & (cs < 0) & (loc == LOC_DISK))
    want_fast = np.flatnonzero((ask >= 0) & (cs >= 0))
    assert want_disk.size > 1000 and want_fast.size == 599
    assert on_disk.tolist() == want_disk.tolist() and disk_home.tolist() == home[want_disk].tolist()
    assert in_fast.tolist() == want_fast.tolist() and fast_slot.tolist() == cs[want_fast].tolist()

    ask_k = np.concatenate([keys, keys + n * 2])  # the second half unknown
    ask_t = np.concatenate([tabs, tabs])
    first, deletions = d.find_beside(ask_k, ask_t)
    first[:100] = -1  # as if inserted after that probe: found again
    new = d.insert(ask_k[n : n + 50], ask_t[n : n + 50])
    got = d.known_lids(ask_k, ask_t, first, deletions)
    assert got.tolist() == d.probe_known(ask_k, ask_t, first, deletions)[0].tolist() == d.find(ask_k, ask_t).tolist()
    assert got[n : n + 50].tolist() == new.tolist() and (first[:100] == -1).all()  # its input is left alone
    d.delete(new[:10])
    stale = got.copy()
    assert d.known_lids(ask_k, ask_t, stale, deletions).tolist() == d.find(ask_k, ask_t).tolist()


def test_keep_until_is_maximum_at_and_distinct_order_the_stable_order() -> None:
    """The window's keep-until of resident rows as ``np.maximum.at`` (slots repeated), and the sort of distinct
    values as the stable one."""
    from tierec.embedding.layout import RecordLayout
    from tierec.embedding.table import TableConfig
    from tierec.store.fast_tier import FastTier
    from tierec.store.sorted_search import distinct_order

    rng = np.random.default_rng(9)
    fast = FastTier(50, RecordLayout.of_tables([TableConfig(name="t", dim=2, features=["f"])]), "cpu")
    fast.keep[:] = rng.integers(0, 20, 51)
    want = fast.keep.copy()
    slots, until = rng.integers(1, 51, 400), rng.integers(0, 40, 400)
    np.maximum.at(want, slots, until)
    fast.keep_until(slots, until)
    assert fast.keep.tolist() == want.tolist()
    for dtype in (np.int32, np.int64):
        a = rng.choice(10**9, 30_000, replace=False).astype(dtype)
        assert distinct_order(a).tolist() == np.argsort(a, kind="stable").tolist()


def test_find_beside_runs_beside_inserts_that_grow_the_directory_and_deletes() -> None:
    """``find_beside`` on one thread while another inserts (growing every per-lid array, which may move them, and
    rebuilding the map) and deletes rows: pairs never deleted keep their lids, and each lid given for a pair
    deleted and inserted again in turns is the one it had while ``deletions`` was the number returned beside it
    (or -1: not inserted yet then)."""
    import threading

    d = Directory(initial_rows=16)
    keys = 1_000_000 + np.arange(2000, dtype=np.int64) * 7  # apart from the pairs below
    tabs = (np.arange(2000) % 5).astype(np.int32)
    first = d.insert(keys, tabs)  # never deleted
    extra = np.arange(10_000, 10_400, dtype=np.int64)  # deleted and inserted again, a different 200 each round
    zeros = np.zeros(extra.size, dtype=np.int32)
    seen: list[tuple[int, np.ndarray]] = []
    moved: list[str] = []
    stop = threading.Event()

    def finder() -> None:
        while not stop.is_set() or len(seen) < 5:
            lids, _ = d.find_beside(keys, tabs)
            if lids.tolist() != first.tolist():
                moved.append(f"pairs never deleted found at other lids (call {len(seen)})")
                return
            got, deletions = d.find_beside(extra, zeros)
            seen.append((deletions, got))

    epochs: dict[int, dict[int, int]] = {}  # deletions -> lid of each extra pair inserted while it held
    t = threading.Thread(target=finder)
    t.start()
    try:
        rng = np.random.default_rng(2)
        for r in range(30):  # 30 rounds of 4k new pairs: the arrays grow from 16 rows to 120k
            d.insert(100_000 + r * 4000 + np.arange(4000, dtype=np.int64), np.zeros(4000, dtype=np.int32))
            have = d.find(extra, zeros)
            d.delete(have[have >= 0])
            add = np.sort(rng.choice(extra, 200, replace=False))
            epochs[d.deletions] = dict(zip(add.tolist(), d.insert(add, np.zeros(200, dtype=np.int32)).tolist()))
    finally:
        stop.set()
        t.join()
    assert not moved, moved
    assert d.high > 100_000 and d.find(keys, tabs).tolist() == first.tolist()
    assert len({dl for dl, _ in seen}) > 1  # the finder saw the directory at several stages
    for deletions, got in seen:
        known = got >= 0
        assert [epochs[deletions][k] for k in extra[known].tolist()] == got[known].tolist()


def test_column_kernels_equal_the_split_path() -> None:
    """Reading counts and writing home tiers and slots of listed lids (kernels) leave the directory as numpy's path
    through the split does (a Python list of lids takes that path), resident and away rows mixed."""
    from tierec.store.directory import LOC_DISK, LOC_HOST

    def made() -> Directory:
        rng = np.random.default_rng(3)
        d = Directory(n_tables=2, cache_slots=201)
        lids = d.insert(np.arange(1000, dtype=np.int64), np.zeros(1000, dtype=np.int32))
        d.loc[lids] = rng.choice([LOC_HOST, LOC_DISK], 1000).astype(np.int8)
        d.home[lids] = rng.permutation(1000)
        d.freq[lids] = rng.integers(0, 500, 1000).astype(np.float32)
        up = rng.choice(1000, 200, replace=False)
        d.come_up(lids[up], np.arange(1, 201), d.loc[lids[up]], d.home[lids[up]])
        d.c_freq[1:201] += 0.5  # resident counts are exact, away ones quantised
        return d

    fast, plain = made(), made()
    rng = np.random.default_rng(4)
    pick = rng.choice(1000, 300, replace=False)
    assert np.array_equal(fast.freq[pick], plain.freq[pick.tolist()])
    loc = rng.choice([LOC_HOST, LOC_DISK], 300).astype(np.int8)
    home = rng.integers(0, 5000, 300)
    fast.loc[pick], plain.loc[pick.tolist()] = loc, loc
    fast.home[pick], plain.home[pick.tolist()] = home, home
    fast.loc[pick[:10]], plain.loc[pick[:10].tolist()] = LOC_HOST, LOC_HOST  # a scalar broadcast
    for name in ("tier", "pos", "c_loc", "c_home"):
        assert np.array_equal(getattr(fast, name), getattr(plain, name)), name
    assert fast.loc[pick].tolist() == [LOC_HOST] * 10 + loc[10:].tolist()
    with pytest.raises(OverflowError):
        fast.home[pick[:1]] = 1 << 31


def test_probe_split_over_threads_equals_the_serial_probe() -> None:
    """A probe of many pairs (a read-ahead window's) runs in spans on the caller's numba threads: the same columns."""
    import numba

    from tierec.store.directory import LOC_DISK, PROBE_SPAN

    rng = np.random.default_rng(8)
    d = Directory(n_tables=2, cache_slots=1000)
    n = 3 * PROBE_SPAN
    keys, tabs = rng.permutation(4 * n)[:n].astype(np.int64), rng.integers(0, 2, n).astype(np.int32)
    lids = d.insert(keys, tabs)
    d.loc[lids] = LOC_DISK
    d.home[lids] = rng.permutation(n)
    d.come_up(lids[:999], np.arange(1, 1000), d.loc[lids[:999]], d.home[lids[:999]])
    ask_k, ask_t = np.concatenate([keys, keys + 4 * n]), np.concatenate([tabs, tabs])  # half of them unknown
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        serial = d.probe(ask_k, ask_t)
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        split = d.probe(ask_k, ask_t)
    finally:
        numba.set_num_threads(threads)
    for a, b in zip(serial, split):
        assert a.tolist() == b.tolist()
    assert (split[0][:n] == lids).all() and (split[0][n:] == -1).all()


@pytest.mark.parametrize("loc", [None, 1, 2])
@pytest.mark.parametrize("hottest", [True, False])
def test_extreme_away_matches_a_sort(loc, hottest) -> None:
    """The counting-sort ranking of rows away from the fast tier equals a plain sort by (count, lid)."""
    from tierec.store.directory import LOC_DISK, LOC_HOST, quantise

    rng = np.random.default_rng(3)
    d = Directory(n_tables=4, cache_slots=64)
    n = 5000
    lids = d.insert(rng.permutation(n * 3)[:n].astype(np.int64), rng.integers(0, 4, n).astype(np.int32))
    d.loc[lids] = rng.choice([LOC_HOST, LOC_DISK], n).astype(np.int8)
    d.home[lids] = np.arange(n)
    d.freq[lids] = rng.zipf(1.5, n).astype(np.float32)
    d.come_up(lids[:40], np.arange(1, 41), d.loc[lids[:40]], d.home[lids[:40]])  # resident: never chosen
    d.delete(lids[40:90])  # freed lids: never chosen
    live = np.setdiff1d(lids[90:], lids[:40])
    pool = live if loc is None else live[d.loc[live] == loc]
    q = quantise(d.freq[pool]).astype(np.int64)
    ref = pool[np.lexsort((pool, -q if hottest else q))]
    for k in (0, 1, 17, 600, pool.size, pool.size + 5):
        assert d.extreme_away(k, loc, hottest).tolist() == ref[:k].tolist()


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("k", [1, 700, 9_000, 30_000])
@pytest.mark.parametrize("foreseen", [0.0, 0.5, 0.97])
@pytest.mark.parametrize("hinted", [False, True])
def test_coldest_evictable_chooses_the_lowest_scores_that_evictable_and_lowest_choose(ties, soft, k, foreseen, hinted) -> None:
    """Against a plain reference: every evictable slot's score (raised by its next use inside a horizon for a
    share ``foreseen`` of the rows), then the k lowest. ``hinted``: the fast tier's copies of the next uses as
    a store keeps them (the use itself where it is inside the horizon, else stale or none)."""
    rng = np.random.default_rng(k)
    c = 100_001  # a fast tier of 100,000 slots and the zero slot: the sampled path
    slot_lid = np.where(rng.random(c) < 0.9, rng.integers(0, 10**6, c), -1).astype(np.int32)
    pin = rng.integers(0, 12, c)  # lookups 10 and 11 pin theirs
    keep = np.where(rng.random(c) < 0.1, 15, 0)  # kept for a later batch of a window
    score = (rng.integers(0, 40, c) if ties else rng.random(c)).astype(np.float32)  # few values: ties at the k-th score
    step, until = 50, 50 + 128  # next uses in steps 51..178 rank above every score, the sooner the higher
    next_at = np.where(rng.random(10**6) < foreseen, rng.integers(51, 179, 10**6), rng.integers(0, 51, 10**6))
    next_at = np.where(rng.random(10**6) < 0.02, 500, next_at).astype(np.int32)  # beyond the horizon: not counted
    t = next_at[np.maximum(slot_lid, 0)]
    ranked = np.where((slot_lid >= 0) & (t > step) & (t <= until), BEFORE_ALL - t, score.astype(np.float64))
    uses = (next_at, step, until) if foreseen else None
    hint = None
    if hinted:  # a copy for 70% of the rows used inside the horizon; others none, or of a use already past
        inside = (slot_lid >= 0) & (t > step) & (t <= until)
        hint = np.where(inside & (rng.random(c) < 0.7), t, np.where(rng.random(c) < 0.5, rng.integers(0, step + 1, c), 0))
        hint = np.where(slot_lid >= 0, hint, 0).astype(np.int32)
    for clock in (11, 100):  # (100: nothing pinned nor kept)
        ref_slots, ref_scores = evictable(slot_lid, pin, clock, ranked, keep, soft=soft)
        want = np.sort(ref_scores[lowest(ref_scores, k)])
        got, movable = coldest_evictable(slot_lid, pin, clock, score, keep, k, soft=soft, uses=uses, hint=hint)
        assert movable == ref_slots.size if ref_slots.size < k else k <= movable <= ref_slots.size
        assert np.unique(got).size == got.size == k and np.isin(got, ref_slots).all()
        assert np.sort(ranked[got]).tolist() == want.tolist()
        plain_slots, plain_scores = evictable(slot_lid, pin, clock, score, keep, soft=soft, uses=uses)
        assert np.array_equal(plain_slots, ref_slots) and np.array_equal(plain_scores, ref_scores)


def test_host_tier_reuses_low_slots() -> None:
    h = HostTier(width=2, max_rows=None)
    s = h.alloc(2000)
    h.write(s, np.ones((2000, 2), dtype=np.float32))
    h.free(s[:1000])
    assert h.alloc(10).tolist() == list(range(10)) and h.high == 2000


def _disk(tmp_path, reads: str, **kw) -> DiskTier:
    """A disk tier reading by ``reads``: "aio" or "threads" (O_DIRECT, native AIO or blocking calls),
    "buffered" (the fallback where O_DIRECT is refused), "cached" (pages kept)."""
    engine = {"aio": "aio", "threads": "threads"}.get(reads, "auto")
    try:
        d = DiskTier(str(tmp_path), io_engine=engine, drop_cache=reads != "cached", **kw)
    except DiskTierError:
        pytest.skip("this system refuses native AIO")
    if reads in ("aio", "threads") and d.dfd < 0:
        pytest.skip("this file system refuses O_DIRECT")
    if reads == "buffered" and d.dfd >= 0:
        os.close(d.dfd)
        d.dfd = -1
    assert d.aio == (reads == "aio")
    return d


@pytest.mark.parametrize("reads", ["aio", "threads", "buffered"])
def test_disk_tier_reads_records_across_spans_longer_than_one_read_call(tmp_path, reads) -> None:
    """Records close together share one request, read up to 256 KiB per call (native AIO: in batches of 1 MiB
    through two buffers): 28-byte records straddle the calls' ends, in a file of 4 MiB; on demand and ahead the
    records are those written."""
    d = _disk(tmp_path, reads, width=6, io_threads=3)
    n = (4 << 20) // 28
    recs = np.random.default_rng(4).standard_normal((n, 6)).astype(np.float32)
    slots = d.append(np.arange(n), recs)
    g = np.random.default_rng(5)
    every_other = g.permutation(np.arange(0, n, 2))  # runs of one record: one starts near every call's end
    # in any order, sorted (read in place), consecutive, with duplicates
    for want in (every_other, g.choice(n, 20_000, replace=False), np.sort(g.choice(n, 20_000, replace=False)),
                 np.arange(n - 40_000, n), g.integers(0, n, 3000)):
        assert np.array_equal(d.read(slots[want]), recs[want])
        pending = d.submit_read(slots[want])
        ahead = pending.result()  # [m, 1 + W]: the lid header, then the payload
        assert pending.buf.base is None and pending.nbytes == ahead.nbytes  # the read buffer itself is freed
        assert np.array_equal(ahead[:, 1:], recs[want]) and np.array_equal(ahead[:, 0].view(np.int32), want)
    assert (d.dfd >= 0) == (reads != "buffered")  # no read came back short (that would turn O_DIRECT off)
    d.close()


def test_a_disk_tier_dropped_without_close_gives_back_its_descriptors_and_aio_contexts(tmp_path) -> None:
    """A run's stores are not closed after Trainer.fit: collecting the tier frees what it holds of the kernel."""
    import gc
    import time

    d = _disk(tmp_path, "aio", width=3)
    d.append(np.arange(10), np.ones((10, 3), dtype=np.float32))
    assert d.read(np.arange(10)).shape == (10, 3)
    handles, contexts = d._handles, list(d._aio_free)  # the holder, not the tier: it keeps nothing of the tier alive
    assert contexts and all(c.open for c in contexts)
    d.drop_page_cache(sync=True)  # its writes' flushes done: the flush thread lets go of the tier
    del d
    for _ in range(200):  # (a moment after a flush's result is set, its thread still holds it)
        gc.collect()
        if not any(c.open for c in contexts):
            break
        time.sleep(0.01)
    assert not any(c.open for c in contexts)
    assert handles.fd == handles.dfd == -1  # both descriptors closed (their numbers may be another file's by now)


def test_disk_tier_reads_by_blocking_calls_where_the_kernel_refuses_its_aio_context(tmp_path) -> None:
    """A forked child inherits the tier but not its AIO context (the kernel's is the parent's): its reads fail
    there, and the tier reads the same records by blocking calls from then on; the parent's stay on AIO."""
    d = _disk(tmp_path, "aio", width=3, io_threads=2)
    recs = np.random.default_rng(7).standard_normal((5000, 3)).astype(np.float32)
    slots = d.append(np.arange(5000), recs)
    assert np.array_equal(d.read(slots), recs)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if it read the records and left AIO
        ok = False
        try:
            ok = np.array_equal(d.read(slots[::-1]), recs[::-1]) and not d.aio and d.dfd >= 0
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert d.aio and np.array_equal(d.submit_read(slots[::2]).result()[:, 1:], recs[::2])
    d.close()


def test_disk_tier_reads_wait_for_a_context_where_the_kernel_opens_no_more(tmp_path) -> None:
    """With every AIO context the kernel allows taken (``fs.aio-max-nr``: this test takes them), reads from four
    threads at once share the tier's one context: each waits for it and gets the records written."""
    from concurrent.futures import ThreadPoolExecutor

    from tierec.store.aio import open_context

    d = _disk(tmp_path, "aio", width=3, io_threads=2)
    recs = np.random.default_rng(8).standard_normal((20_000, 3)).astype(np.float32)
    slots = d.append(np.arange(20_000), recs)
    hog = []
    try:
        while len(hog) < 20_000 and (ctx := open_context(64)) is not None:
            hog.append(ctx)
        if len(hog) == 20_000:
            pytest.skip("this kernel allows more AIO contexts than the test takes")
        picks = [np.random.default_rng(i).choice(20_000, 5_000, replace=False) for i in range(8)]
        with ThreadPoolExecutor(4) as ex:
            got = list(ex.map(lambda p: d.read(slots[p]), picks))
        assert all(np.array_equal(g, recs[p]) for g, p in zip(got, picks))
        assert d.aio and d._aio_live == 1
    finally:
        with ThreadPoolExecutor(64) as ex:  # each destroy waits out an RCU grace period: one by one, 30 s
            list(ex.map(lambda c: c.close(), hog))
    d.close()


@pytest.mark.parametrize("reads", ["aio", "threads", "buffered", "cached"])
def test_disk_tier_appends_reads_and_compacts(tmp_path, reads) -> None:
    d = _disk(tmp_path, reads, width=3, segment_rows=8, io_threads=4)
    g = np.random.default_rng(1)
    where = {}  # lid -> (slot, record)
    for step in range(40):
        lids = np.arange(step * 5, step * 5 + 5)
        recs = g.standard_normal((5, 3)).astype(np.float32)
        for lid, slot, rec in zip(lids, d.append(lids, recs), recs):
            where[int(lid)] = (int(slot), rec)
        old = [k for k in where if g.random() < 0.3]  # rewrite some rows: the old copies die
        if old:
            recs = g.standard_normal((len(old), 3)).astype(np.float32)
            d.free(np.array([where[k][0] for k in old]))
            for k, slot, rec in zip(old, d.append(np.array(old), recs), recs):
                where[k] = (int(slot), rec)
        moved_lids, moved_slots = d.compact()
        for lid, slot in zip(moved_lids, moved_slots):
            where[int(lid)] = (int(slot), where[int(lid)][1])
    slots = np.array([v[0] for v in where.values()])
    got = d.read(slots[::-1])
    want = np.stack([v[1] for v in where.values()])[::-1]
    assert np.array_equal(got, want)
    assert d.live_rows == len(where) and d.garbage_ratio() <= 2.5
    live = np.sort(slots)  # the live bitmap and per-segment counts agree with the records kept here
    assert np.array_equal(np.flatnonzero(np.unpackbits(d.live, bitorder="little")), live)
    assert np.array_equal(d.seg_live, np.bincount(live // 8, minlength=d.n_segments))
    assert not np.intersect1d(d._free_segs, live // 8).size and d._tail not in d._free_segs
    assert d.bytes_read > 0 and d.bytes_written > 0
    d.close()


@pytest.mark.parametrize("max_ratio", [2.0, 1.25])
def test_disk_tier_compaction_keeps_the_file_near_its_live_records(tmp_path, max_ratio) -> None:
    """Rows die all over the file (no segment empties by itself): one compaction brings the segments in use
    down to ``max_ratio`` slots per live record, however many segments that takes, and moves no value."""
    d = DiskTier(str(tmp_path), width=2, segment_rows=8, max_ratio=max_ratio)
    g = np.random.default_rng(3)
    n = 8 * 20
    recs = g.standard_normal((n, 2)).astype(np.float32)
    slots = d.append(np.arange(n), recs)
    dead = np.zeros(n, dtype=bool)
    for seg in range(20):  # 5 of each segment's 8 records die
        dead[seg * 8 + g.choice(8, 5, replace=False)] = True
    d.free(slots[dead])
    assert d.garbage_ratio() > 2.5
    moved_lids, moved_slots = d.compact()
    assert d.garbage_ratio() <= max_ratio
    where = dict(zip(np.flatnonzero(~dead).tolist(), slots[~dead].tolist()))
    where.update(zip(moved_lids.tolist(), moved_slots.tolist()))
    live = np.array(sorted(where))
    assert np.array_equal(d.read(np.array([where[k] for k in live]), lids=live), recs[live])
    assert d.live_rows == live.size
    d.close()


def test_the_disk_files_bound_is_a_setting(tmp_path) -> None:
    """store.disk_max_ratio reaches the disk tier of every store; 1 or less is refused, naming the key."""
    from tierec.config import load_config
    from tierec.embedding.layout import RecordLayout
    from tierec.embedding.table import TableConfig
    from tierec.store.group import TierStore
    from tierec.store.plan import StorePlan

    over = ["store.enabled=true", "store.memory_budget=1MiB", f"store.disk_path={tmp_path}"]
    tables = [TableConfig(name="t", dim=4, features=["f"])]
    for given, ratio in ((None, 1.25), ("2", 2.0)):
        cfg = load_config(None, over + ([] if given is None else [f"store.disk_max_ratio={given}"]))
        g = TierStore(RecordLayout.of_tables(tables), StorePlan(cfg.store, [tables]).spec_for(tables))
        assert g.disk.max_ratio == ratio
        g.close()
    with pytest.raises(ConfigError, match=r"store\.disk_max_ratio must be above 1"):
        load_config(None, over + ["store.disk_max_ratio=1"])


def test_disk_tier_compacts_a_bounded_share_per_call(tmp_path) -> None:
    """``compact(most=k)`` moves at most k records (part of a segment too), later calls go on where it stopped,
    and together they end where one unbounded call would; ``appended_rows`` counts the callers' appends only."""
    d = DiskTier(str(tmp_path), width=2, segment_rows=8, max_ratio=1.25)
    g = np.random.default_rng(4)
    n = 8 * 20
    recs = g.standard_normal((n, 2)).astype(np.float32)
    slots = d.append(np.arange(n), recs)
    dead = np.zeros(n, dtype=bool)
    for seg in range(20):
        dead[seg * 8 + g.choice(8, 5, replace=False)] = True
    d.free(slots[dead])
    where = dict(zip(np.flatnonzero(~dead).tolist(), slots[~dead].tolist()))
    calls = 0
    while True:
        moved_lids, moved_slots = d.compact(most=2)
        assert moved_lids.size <= 2
        where.update(zip(moved_lids.tolist(), moved_slots.tolist()))
        calls += 1
        if moved_lids.size == 0:
            break
    assert calls > 10 and d.garbage_ratio() <= 1.25
    assert d.appended_rows == n  # the moves are not appends of the caller's
    live = np.array(sorted(where))
    assert np.array_equal(d.read(np.array([where[k] for k in live]), lids=live), recs[live])
    d.close()


def test_disk_tier_compaction_stops_where_moving_wins_nothing(tmp_path) -> None:
    """Two and a half full segments are already as compact as segments go: nothing moves."""
    d = DiskTier(str(tmp_path), width=1, segment_rows=8, max_ratio=1.05)
    d.append(np.arange(20), np.zeros((20, 1), dtype=np.float32))
    assert d.garbage_ratio() > 1.05
    assert d.compact()[0].size == 0
    d.close()


def test_count_min_sketch_never_undercounts() -> None:
    g = np.random.default_rng(2)
    s = CountMinSketch(width=64, depth=3, seed=0)
    keys = g.integers(0, 500, size=300)
    truth: dict[int, int] = {}
    for k in keys:
        truth[int(k)] = truth.get(int(k), 0) + 1
        est = s.add(np.array([k]), np.zeros(1, dtype=np.int32))[0]
        assert est >= truth[int(k)]


def test_tiered_group_is_composed_and_freed_without_the_cycle_collector(tmp_path) -> None:
    """The hotness pass and the records are parts, not bases (the group's one base is its TierStore, whose
    state it leaves alone; the plain group shares helpers with it, not a class); they reach the group only
    through its TierMoves, which hold it weakly, so dropping the group frees it (and its fast tier) at once."""
    import gc
    import weakref

    from tierec.embedding.table import TableConfig
    from tierec.store.group import TierStore
    from tierec.store.tiered_group import TieredGroup
    from tierec.store.spec import TierSpec

    assert TieredGroup.__bases__ == (TierStore,) and TierStore.__bases__ == (object,)
    spec = TierSpec(cache_bytes=4 * 20, host_bytes=4 * 20 * 2, disk_dir=str(tmp_path), interval=2, promote_max=4)
    g = TieredGroup([TableConfig(name="t", dim=4, features=["f"])], spec)
    for batch in ([1, 2, 3], [4, 5], [1, 6], [7, 8], [2, 9]):
        g.lookup(np.array(batch, dtype=np.int64), np.zeros(len(batch), dtype=np.int32), insert=True)
    g.maintain()
    g.place_by_hotness()
    sd = whole_table_state(g, 0)
    assert sd["ids"].numel() == g.num_rows == 9 and int(sd["store.clock"][0]) == 5
    g.close()
    gc.disable()
    try:
        group, fast = weakref.ref(g), weakref.ref(g.fast)
        del g
        assert group() is None and fast() is None
    finally:
        gc.enable()


def test_note_uses_copies_each_rows_next_use_into_its_slot() -> None:
    """``FastTier.note_uses`` (its kernel asks for both ends ahead) is numpy's ``out[slots] = next_at[lids]``,
    0 for lids past the horizon's end."""
    from tierec.embedding.layout import RecordLayout
    from tierec.embedding.table import TableConfig
    from tierec.store.fast_tier import FastTier

    rng = np.random.default_rng(11)
    fast = FastTier(3000, RecordLayout.of_tables([TableConfig(name="t", dim=2, features=["f"])]), "cpu")
    next_at = rng.integers(1, 500, 40_000).astype(np.int32)
    slots = rng.permutation(np.arange(1, 3001))[:2500].astype(np.int64)
    lids = rng.integers(0, 45_000, 2500).astype(np.int64)  # some past the end of next_at
    before = fast.next_use.copy()
    fast.note_uses(slots, lids, next_at)
    want = before.copy()
    want[slots] = np.where(lids < next_at.size, next_at[np.minimum(lids, next_at.size - 1)], 0)
    assert fast.next_use.tolist() == want.tolist() and (lids >= next_at.size).sum() > 100


def test_count_use_adds_one_use_and_the_step_to_each_slot() -> None:
    """``Directory.count_use`` (a kernel) is numpy's fancy add and store on the slot columns."""
    rng = np.random.default_rng(12)
    d = Directory(n_tables=1, cache_slots=5000)
    d.c_freq[:] = rng.random(5000).astype(np.float32) * 9
    d.c_last[:] = rng.integers(0, 50, 5000)
    freq, last = d.c_freq.copy(), d.c_last.copy()
    slots = rng.permutation(np.arange(1, 5000))[:3000]
    d.count_use(slots, 77)
    freq[slots] += np.float32(1.0)
    last[slots] = 77
    assert d.c_freq.tolist() == freq.tolist() and d.c_last.tolist() == last.tolist()
