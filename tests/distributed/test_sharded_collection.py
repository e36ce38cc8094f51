"""The sharded collection against the single-process one on the same global batches (gloo, spawned ranks)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dist_workers import FEATURES, collection_worker, make_batches, make_tables, merge_shards, reference
from tierec.batch import SparseFeatures
from tierec.config import DistConfig
from tierec.distributed import DistContext, ShardedEmbeddingCollection
from tierec.distributed.data import slice_bounds, slice_sparse
from tierec.distributed.exchange import owner_of
from tierec.distributed.launch import spawn

VARIANTS = [
    ("plain", {"overlap": False}),
    ("hot", {"hot_rows": 24, "hot_refresh_every": 2, "hot_min_share": 0.01, "overlap": True}),
    ("naive", {"dedupe": False, "overlap": True}),
]


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_training_matches_one_process(tmp_path: Path, world: int) -> None:
    spawn(collection_worker, world, (str(tmp_path), VARIANTS))
    ref_state, ref_out = reference(make_batches())
    ref = merge_shards([ref_state])
    for name, _ in VARIANTS:
        results = [torch.load(tmp_path / f"{name}-rank{r}.pt") for r in range(world)]
        got = merge_shards([r["state"] for r in results])
        assert got.keys() == ref.keys()
        for t in ref:
            assert got[t].keys() == ref[t].keys(), (name, t)
            a = torch.stack([ref[t][i] for i in sorted(ref[t])])
            b = torch.stack([got[t][i] for i in sorted(ref[t])])
            torch.testing.assert_close(b, a, rtol=1e-5, atol=2e-6, msg=f"{name}: table {t}")
        for sd in (r["state"] for r in results):
            assert int(sd["group0.step"]) == int(ref_state["group0.step"])
        out = torch.cat([r["eval"] for r in results])  # slices in rank order = the global batch
        torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=2e-6, msg=name)
        for r in results:  # a handle given to another batch, twice, or after a later one is refused (dist_workers)
            assert len(r["refused"]) == 3, (name, r["refused"])
            for error, says in zip(r["refused"], ("prepared for another batch", "already used", "already waited out")):
                assert says in error, (name, error)
        if name == "hot":
            assert all(r["hot_rows"] > 0 for r in results)
            assert results[0]["hot_rows"] == results[-1]["hot_rows"]
            assert results[0]["moves"]["joined"] > 0 and results[0]["moves"]["left"] > 0  # both handovers ran


def test_a_forward_takes_only_the_exchange_prepared_for_its_batch() -> None:
    """The handle ``prepare`` returns is checked as on several processes (where it carries the ids in flight,
    test_sharded_training_matches_one_process): its own batch's ids only, once, in posting order."""
    batches = [sp for sp, _ in make_batches(3)]
    coll, other = (ShardedEmbeddingCollection.build(make_tables(), FEATURES, DistContext.single(), DistConfig(), seed=3)
                   for _ in range(2))
    a, b = coll.prepare(batches[0]), coll.prepare(batches[1])
    with pytest.raises(ValueError, match="prepared for another batch"):
        coll(batches[0], b)
    with pytest.raises(ValueError, match="prepared by another collection"):
        other(batches[0], a)
    same_ids = SparseFeatures(batches[0].keys, batches[0].values.clone(), batches[0].offsets.clone(), batches[0].batch_size)
    torch.testing.assert_close(coll(same_ids, a), other(batches[0]))
    with pytest.raises(ValueError, match="already used"):
        coll(batches[0], a)
    coll(batches[2], coll.prepare(batches[2]))  # b, posted before, was never used: waited out
    with pytest.raises(ValueError, match="already waited out"):
        coll(batches[1], b)
    coll.close()


def test_owner_is_a_stable_function_of_table_and_id() -> None:
    keys = np.arange(1000, dtype=np.int64)
    a = owner_of(keys, np.zeros(1000, dtype=np.int32), 4)
    assert np.array_equal(a, owner_of(keys.copy(), np.zeros(1000, dtype=np.int32), 4))
    assert not np.array_equal(a, owner_of(keys, np.ones(1000, dtype=np.int32), 4))  # the table matters
    assert set(np.unique(a)) == {0, 1, 2, 3}


def test_slices_cover_the_batch_in_order() -> None:
    sp, _ = make_batches(1)[0]
    for world in (1, 3, 4):
        parts = [slice_sparse(sp, *slice_bounds(sp.batch_size, world, r)) for r in range(world)]
        for f in sp.keys:
            assert torch.equal(torch.cat([p[f].values for p in parts]), sp[f].values)
        assert sum(p.batch_size for p in parts) == sp.batch_size
