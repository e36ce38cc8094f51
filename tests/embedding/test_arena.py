"""Arena-backed table storage: growth keeps every row, spare capacity stays out of RAM,
and a table grown through arenas trains exactly like one grown with ndarray.resize."""

import numpy as np
import pytest
import torch

import tierec.embedding.arena as arena_mod
from tierec.config import OptimizerConfig, OptimizerKind
from tierec.embedding.arena import PAGE, Arena, GrowableArray, arena_supported, resident_bytes
from tierec.embedding.group import TableGroup
from tierec.embedding.table import TableConfig
from tierec.embedding.storage import whole_table_state

needs_arena = pytest.mark.skipif(not arena_supported(), reason="needs Linux mmap/mremap")


@needs_arena
def test_grow_keeps_contents_and_new_bytes_are_zero():
    a = Arena(3 * PAGE + 5)
    x = a.array(np.int64, (3 * PAGE // 8,))
    x[:] = np.arange(x.size)
    for size in (64 * PAGE, 4096 * PAGE):  # the second grow is likely to move the mapping
        a.grow(size * 8)
        y = a.array(np.int64, (size,))
        np.testing.assert_array_equal(y[: x.size], np.arange(x.size))
        assert not y[x.size :].any()


@needs_arena
def test_spare_capacity_is_not_resident():
    a = Arena(1 << 26)  # 64 MiB
    x = a.array(np.float32, (1 << 24,))
    assert resident_bytes(x) == 0
    x[: 10 * PAGE // 4] = 1.0  # write 10 pages
    assert resident_bytes(x) == 10 * PAGE
    a.grow(1 << 27)
    y = a.array(np.float32, (1 << 25,))
    assert resident_bytes(y) == 10 * PAGE
    assert float(y.sum()) == 10 * PAGE // 4


def test_resident_bytes_of_a_written_array_is_its_size():
    x = np.ones(1 << 20, dtype=np.float32)
    assert abs(resident_bytes(x) - x.nbytes) <= 2 * PAGE


def test_view_past_the_end_is_refused():
    if not arena_supported():
        pytest.skip("needs Linux mmap/mremap")
    with pytest.raises(ValueError, match="needs"):
        Arena(PAGE).array(np.float32, (PAGE,))


@pytest.mark.parametrize("kind", [OptimizerKind.ROWWISE_ADAGRAD, OptimizerKind.ADAGRAD, OptimizerKind.ADAM])
def test_group_grown_in_arenas_trains_like_resize(monkeypatch, kind):
    """Same inserts, lookups and updates: bitwise the same rows, optimizer state and index."""
    opt = OptimizerConfig(kind=kind, lr=0.05, initial_accumulator=0.1)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 50_000, size=3000) for _ in range(6)]  # grows past the initial 1024 rows
    grads = [torch.from_numpy(rng.standard_normal((3000, 8)).astype(np.float32)) for _ in batches]

    def train(use_arena: bool) -> tuple[dict, TableGroup]:
        monkeypatch.setattr(arena_mod, "arena_supported", lambda: use_arena and arena_supported())
        g = TableGroup([TableConfig(name="t", dim=8, features=["f"], optimizer=opt)], seed=3)
        for keys, grad in zip(batches, grads):
            u, first = np.unique(keys, return_index=True)
            rows = g.lookup(u, np.zeros(u.size, dtype=np.int32), insert=True)
            g.update(rows, grad[torch.from_numpy(first)])
        return whole_table_state(g, 0), g

    ref, g_resize = train(False)
    got, g_arena = train(True)
    assert g_arena.weights.shape == g_resize.weights.shape and g_arena.num_rows > 1024
    assert set(ref) == set(got)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=0, atol=0)
    if arena_supported():
        assert g_arena._owned["weights"]._arena is not None and g_arena.index._keys._arena is not None  # really ran
        assert g_resize._owned["weights"]._arena is None and g_resize.index._keys._arena is None
        assert g_arena.resident_nbytes() <= g_arena.nbytes()


def test_rows_inserted_into_grown_capacity_start_from_the_initial_state():
    opt = OptimizerConfig(kind=OptimizerKind.ADAGRAD, initial_accumulator=0.25)
    g = TableGroup([TableConfig(name="t", dim=4, features=["f"], optimizer=opt)])
    for start in (0, 5000, 20_000):  # each call grows the tables
        keys = np.arange(start, start + 5000, dtype=np.int64)
        rows = g.lookup(keys, np.zeros(keys.size, dtype=np.int32), insert=True)
        assert torch.equal(g.state["sum"][rows], torch.full((keys.size, 4), 0.25))
        assert g.weights[rows].abs().max() <= 0.5 and g.weights[rows].abs().sum() > 0


def test_a_deep_copy_trains_on_its_own_and_survives_growth():
    """copy.deepcopy of a grown collection: training the copy through more growth gives what
    training the original gives, and leaves the original untouched."""
    import copy

    from tierec.batch import SparseFeatures
    from tierec.embedding import EmbeddingCollection

    rng = np.random.default_rng(1)
    names = ["a", "b"]
    coll = EmbeddingCollection([TableConfig(name=n, dim=4, features=[n]) for n in names], names)

    def batch(hi: int) -> SparseFeatures:
        return SparseFeatures.one_hot(tuple(names), torch.from_numpy(rng.integers(0, hi, size=(4000, 2))))

    for _ in range(2):
        coll(batch(3000)).sum().backward()  # grown past the initial capacity
    twin = copy.deepcopy(coll)
    before = {k: v.clone() for k, v in coll.state_dict().items()}
    later = [batch(60_000) for _ in range(3)]  # many new ids: both grow again
    for b in later:
        twin(b).square().sum().backward()
    after_copy = coll.state_dict()
    for k in before:
        assert torch.equal(before[k], after_copy[k]), k  # the original did not move
    for b in later:
        coll(b).square().sum().backward()
    got, want = twin.state_dict(), coll.state_dict()
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_copies_of_growable_arrays_own_their_memory():
    import copy
    import pickle

    g = GrowableArray(np.arange(10, dtype=np.int64))
    for twin in (copy.deepcopy(g), pickle.loads(pickle.dumps(g))):
        twin.array[:] = -1
        assert g.array.tolist() == list(range(10))
        assert twin.grow(5000, used=10)[:10].tolist() == [-1] * 10
    if arena_supported():
        with pytest.raises(TypeError, match="cannot be copied"):
            copy.deepcopy(Arena(PAGE))


def test_stores_with_their_own_layout_report_their_own_bytes_in_ram():
    from tierec.batch import SparseFeatures
    from tierec.config import PruneConfig
    from tierec.embedding import EmbeddingCollection
    from tierec.storage import storage_factory

    coll = EmbeddingCollection(
        [TableConfig(name="t", dim=8, features=["f"])], ["f"], group_factory=storage_factory(prune=PruneConfig(chunk=4))
    )
    coll(SparseFeatures.one_hot(("f",), torch.arange(3000).view(-1, 1))).sum().backward()
    assert coll.resident_nbytes() == coll.nbytes()
