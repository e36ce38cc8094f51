"""HashIndex and TableGroup against a plain dict; state round trips; deterministic init."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tierec.batch import SparseFeatures
from tierec.config import EmbeddingConfig
from tierec.embedding import EmbeddingCollection, HashIndex, tables_from_config
from tierec.embedding.hash_index import MAX_LOAD, Deduper, table_dtype


@pytest.mark.parametrize(
    ("n_tables", "tagged_rows"),
    [(3, None), (300, None), (3, 1000)],  # int8 / int16 table column; tags dropped past 1000 rows
)
def test_index_matches_dict_through_growth(n_tables: int, tagged_rows: int | None, monkeypatch) -> None:
    from tierec.embedding import hash_index

    if tagged_rows is not None:
        monkeypatch.setattr(hash_index, "TAGGED_ROWS", tagged_rows)
    g = np.random.default_rng(0)
    idx = HashIndex(initial_rows=4, n_tables=n_tables)
    assert idx.tag_bits == hash_index.TAG_BITS
    assert idx.row_tabs.dtype == (np.int8 if n_tables <= 128 else np.int16)
    ref: dict[tuple[int, int], int] = {}
    for _ in range(30):
        keys = np.unique(g.integers(-(2**62), 2**62, size=200) // 997 * 997)  # wide 64-bit ids, some negative
        keys = np.concatenate([keys, keys[:5] + 1])
        tabs = g.integers(0, n_tables, size=keys.shape[0]).astype(np.int32)
        pairs = list(dict.fromkeys(zip(keys.tolist(), tabs.tolist())))
        keys = np.array([p[0] for p in pairs], dtype=np.int64)
        tabs = np.array([p[1] for p in pairs], dtype=np.int32)
        got = idx.lookup(keys, tabs, insert=True)
        for i, p in enumerate(pairs):
            if p not in ref:
                ref[p] = len(ref)
                assert i in set(got.new.tolist())
            assert got.rows[i] == ref[p]
        assert idx.num_rows <= MAX_LOAD * idx.slot_rows.shape[0]  # the slot array never gets fuller than this
    assert idx.num_rows == len(ref) > 5000
    assert idx.tag_bits == (0 if tagged_rows else hash_index.TAG_BITS)
    assert (idx.slot_rows >= 1 << 27).any() == (not tagged_rows)  # tags sit above the row numbers
    assert idx.slot_rows.shape[0] & (idx.slot_rows.shape[0] - 1) != 0  # any size, not a power of two
    np.testing.assert_array_equal(idx.rows_per_table(n_tables), np.bincount([t for _, t in ref], minlength=n_tables))
    # the same key in two tables is two rows: no collisions across tables
    a = idx.lookup(np.array([5, 5], dtype=np.int64), np.array([0, 1], dtype=np.int32), insert=True)
    assert a.rows[0] != a.rows[1]
    miss = idx.lookup(np.array([123456789], dtype=np.int64), np.array([2], dtype=np.int32), insert=False)
    assert miss.rows.tolist() == [-1]


def test_table_column_width() -> None:
    assert table_dtype(128) == np.int8 and table_dtype(129) == np.int16 and table_dtype(32768) == np.int16
    with pytest.raises(ValueError, match="at most 32768 tables"):
        table_dtype(32769)


def test_deduper_matches_numpy_unique() -> None:
    g = np.random.default_rng(1)
    keys = g.integers(0, 50, size=1000).astype(np.int64)
    tabs = g.integers(0, 2, size=1000).astype(np.int32)
    ukeys, utabs, inv = Deduper()(keys, tabs)
    np.testing.assert_array_equal(ukeys[inv], keys)
    np.testing.assert_array_equal(utabs[inv], tabs)
    assert len(set(zip(ukeys.tolist(), utabs.tolist()))) == ukeys.shape[0] == len(set(zip(keys.tolist(), tabs.tolist())))


def _coll(seed: int = 0) -> EmbeddingCollection:
    return EmbeddingCollection(tables_from_config(EmbeddingConfig(dim=4), ["x", "y"]), ["x", "y"], seed=seed)


def test_init_depends_only_on_id_not_order() -> None:
    a, b = _coll(), _coll()
    ids = torch.tensor([[1, 2], [3, 4], [5, 6]])
    with torch.no_grad():
        a(SparseFeatures.one_hot(("x", "y"), ids))
        b(SparseFeatures.one_hot(("x", "y"), ids.flip(0)))
    sa, sb = a.state_dict(), b.state_dict()
    for t in ("x", "y"):
        wa = dict(zip(sa[f"{t}.ids"].tolist(), sa[f"{t}.weights"]))
        wb = dict(zip(sb[f"{t}.ids"].tolist(), sb[f"{t}.weights"]))
        for k in wa:
            torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0)
    other = _coll(seed=1)
    with torch.no_grad():
        other(SparseFeatures.one_hot(("x", "y"), ids))
    assert not torch.allclose(sa["x.weights"], other.state_dict()["x.weights"])  # the seed matters
    w = sa["x.weights"]
    assert w.abs().max() <= 0.5 and w.std() > 0.1  # U(-1/sqrt(4), 1/sqrt(4))


def test_eval_does_not_insert_and_reads_unknown_as_zero() -> None:
    c = _coll()
    ids = torch.tensor([[1, 2], [3, 4]])
    out_train = c(SparseFeatures.one_hot(("x", "y"), ids))
    c.eval()
    out = c(SparseFeatures.one_hot(("x", "y"), torch.tensor([[1, 99], [3, 4]])))
    assert c.num_rows() == 4
    torch.testing.assert_close(out[0, 0], out_train[0, 0].detach())
    assert torch.count_nonzero(out[0, 1]) == 0


def test_state_dict_round_trip_is_exact() -> None:
    c = _coll()
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        ids = torch.randint(0, 20, (8, 2), generator=g)
        c(SparseFeatures.one_hot(("x", "y"), ids)).pow(2).sum().backward()
    sd = c.state_dict()
    d = _coll()
    d.load_state_dict(sd)
    sd2 = d.state_dict()
    assert sd.keys() == sd2.keys()
    for k in sd:
        assert torch.equal(sd[k], sd2[k]), k
    probe = SparseFeatures.one_hot(("x", "y"), torch.randint(0, 20, (8, 2), generator=g))
    c.eval(), d.eval()
    assert torch.equal(c(probe), d(probe))


def test_stats_report_rows_and_bytes() -> None:
    c = _coll()
    with torch.no_grad():
        c(SparseFeatures.one_hot(("x", "y"), torch.tensor([[1, 1], [2, 1], [3, 1]])))
    st = c.table_stats()
    assert st["x"]["rows"] == 3 and st["y"]["rows"] == 1
    assert st["x"]["bytes"] > st["y"]["bytes"] > 0


def test_insert_resumes_where_find_stopped_even_with_repeats() -> None:
    # Inserts resume each probe at the empty slot find stopped at; a key repeated in one
    # call, and keys whose probes cross slots filled earlier in the same call, still get
    # one row each, equal to what a fresh index (full probes after a rebuild) gives.
    g = np.random.default_rng(3)
    idx = HashIndex(initial_rows=4096, n_tables=2)  # large enough that no call rebuilds the slots
    slots = idx.slot_rows
    ref: dict[tuple[int, int], int] = {}
    for _ in range(5):
        keys = g.integers(0, 3000, size=400).astype(np.int64)  # repeats inside each call
        tabs = g.integers(0, 2, size=400).astype(np.int32)
        got = idx.lookup(keys, tabs, insert=True).rows
        for k, t, r in zip(keys.tolist(), tabs.tolist(), got.tolist()):
            assert ref.setdefault((k, t), r) == r
    assert idx.slot_rows is slots and idx.num_rows == len(ref)
    assert sorted(ref.values()) == list(range(len(ref)))


def test_dedupe_by_ranges_equals_one_pass() -> None:
    # Ranges that share no (table, key) pair (one table per range) give exactly the one-pass
    # result: same unique pairs in the same order, same inverse.
    g = np.random.default_rng(4)
    lengths = [3000, 1, 5000, 0, 2500]
    keys = np.concatenate([g.integers(0, 700, size=n) for n in lengths]).astype(np.int64)
    tabs = np.repeat(np.arange(len(lengths)), lengths).astype(np.int32)
    ref = Deduper()(keys, tabs)
    for cuts in ([0, 3001, 8001, 10501], [0, 3000, 3001, 8001, 8001, 10501], [0, 10501]):
        got = Deduper()(keys, tabs, np.array(cuts))
        for a, b in zip(got, ref):
            np.testing.assert_array_equal(a, b)
