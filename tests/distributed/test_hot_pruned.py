"""Hot rows (``dist.hot_rows``) with pruning (``prune.enabled``): a replica keeps each row's own dims.

On the same global batches, 2 processes with hot rows over pruned (and
tiered-and-pruned) tables end with one process's rows, dims, optimizer state,
pruning steps and outputs; every rank's replica of a hot row has the dims one
process gives that row after each pruning step (a pruned hot row shrinks on
every rank alike). The trainer on 2 processes, and on a 2x2 mesh in both
cross-group modes, gives one process's run (``average``: the run without hot
rows). A hot row the pruner forgets at dim 0 leaves the hot set.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dist_workers import SMALL, compare_rows, compare_runs, make_batches, merge_shards
from hier_workers import train_runs_worker
from hot_prune_workers import hot_pruned_worker
from tierec.config import DistConfig, PruneConfig, load_config
from tierec.distributed import DistContext
from tierec.distributed.data import slice_bounds
from tierec.distributed.exchange import Traffic
from tierec.distributed.hot import HotPolicy
from tierec.distributed.launch import spawn
from tierec.embedding.table import TableConfig
from tierec.prune import PrunedGroup
from tierec.train.trainer import Trainer

# ------------------------------------------------------------------ the sharded collection


@pytest.fixture(scope="module")
def collection_runs(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("hotpruned")
    names = ["pruned", "tiered"]
    hot_pruned_worker(DistContext.single(), str(tmp), names, 4.0)
    spawn(hot_pruned_worker, 2, (str(tmp), names, 4.0))
    return tmp


@pytest.mark.parametrize("name", ["pruned", "tiered"])
def test_hot_rows_over_pruned_shards_match_one_process(collection_runs: Path, name: str) -> None:
    ref = torch.load(collection_runs / f"{name}-w1-rank0.pt", weights_only=False)
    parts = [torch.load(collection_runs / f"{name}-w2-rank{r}.pt", weights_only=False) for r in range(2)]
    ra, rb = merge_shards([ref["state"]]), merge_shards([p["state"] for p in parts])
    assert ra.keys() == rb.keys()
    for t in ra:  # rows, their dims, weights and optimizer state
        compare_rows(ra[t], rb[t], 2e-5, f"{name}/{t}")
    # the same chunks pruned and grown back, with the same threshold, on every rank
    assert parts[0]["steps"] == parts[1]["steps"]
    assert [s[:2] for s in parts[0]["steps"]] == [s[:2] for s in ref["steps"]]
    for (_, _, a), (_, _, b) in zip(ref["steps"], parts[0]["steps"]):
        assert a == pytest.approx(b, rel=1e-4)
    assert parts[0]["hist"] == ref["hist"] and ref["steps"][0][0] > 0
    n = make_batches()[-1][0].batch_size
    for r, p in enumerate(parts):
        lo, hi = slice_bounds(n, 2, r)
        torch.testing.assert_close(p["eval"], ref["eval"][lo:hi], rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("name", ["pruned", "tiered"])
def test_every_replica_takes_the_pruners_dims(collection_runs: Path, name: str) -> None:
    ref = torch.load(collection_runs / f"{name}-w1-rank0.pt", weights_only=False)
    parts = [torch.load(collection_runs / f"{name}-w2-rank{r}.pt", weights_only=False) for r in range(2)]
    assert parts[0]["moves"]["joined"] > 0 and all(h > 0 for h in parts[0]["hot_sizes"])
    assert parts[0]["dims"] == parts[1]["dims"]  # the same hot set and dims on every rank
    shrunk = 0
    for step, (replica, one) in enumerate(zip(parts[0]["dims"], ref["dims"])):
        assert replica, step  # rows were hot at each pruning step
        for key, d in replica.items():  # a hot row has the dims one process gives it after the step
            assert d == one.get(key), (step, key)
        shrunk += sum(d < 4 for d in replica.values())
    assert shrunk > 0  # some hot rows were pruned while hot ...
    assert any(len(d) < h for d, h in zip(parts[0]["dims"], parts[0]["hot_sizes"]))  # ... or forgotten at dim 0


# ------------------------------------------------------------------ one process: the hot set after pruning


def test_a_hot_row_forgotten_by_its_owner_leaves_the_hot_set() -> None:
    owner = PrunedGroup([TableConfig(name="t", dim=4, features=["f"])], PruneConfig(chunk=2))
    keys, tabs = np.array([5, 6, 7], dtype=np.int64), np.zeros(3, dtype=np.int32)
    owner.lookup(keys, tabs, insert=True)
    policy = HotPolicy.over(DistConfig(hot_rows=4, hot_min_share=0.01), DistContext.single())
    hot = policy.replica(owner, Traffic())
    mine = lambda k, t: np.zeros(k.shape[0], dtype=np.int32)  # noqa: E731 - one process owns every row
    hot.count(keys, tabs)
    hot.refresh(mine)
    assert sorted(hot.keys.tolist()) == [5, 6, 7] and hot.moves["joined"] == 3
    # the replica trains; the owner's copy is stale until flushed
    rows = hot.find(keys, tabs)
    hot.backward(rows, torch.ones(3, 4), np.ones(3, dtype=np.float32))
    assert not np.allclose(owner.records_of(keys, tabs)[1], hot.group.records_of(keys, tabs)[1])
    hot.flush_to_owner(mine)
    np.testing.assert_array_equal(owner.records_of(keys, tabs)[1], hot.group.records_of(keys, tabs)[1])
    np.testing.assert_array_equal(owner.importance_of(keys, tabs)[1], hot.group.importance_of(keys, tabs)[1])
    # a pruning step on the owner: 6 to 2 dims, 7 to none (forgotten)
    r = owner.lookup(keys, tabs, insert=False).numpy()
    owner.set_row_dims(r[1:], np.array([2, 0]))
    owner.evict_empty_rows()
    version = hot.version
    hot.reload(mine)
    assert sorted(hot.keys.tolist()) == [5, 6] and hot.version > version and hot.moves["left"] == 1
    assert hot.find(keys, tabs)[2] == -1  # 7 is cold again: the next batch inserts it at its owner
    found, rec = hot.group.records_of(keys[:2], tabs[:2])
    assert found.all() and rec[:, -1].tolist() == [4.0, 2.0]  # each row with its own dims
    # a row its owner does not have is never made hot
    hot.count(np.array([7, 8], dtype=np.int64), np.zeros(2, dtype=np.int32))
    hot.refresh(mine)
    assert hot.size == 0


# ------------------------------------------------------------------ the trainer

TINY = SMALL + [
    "data.synthetic.train_rows=1536", "data.synthetic.test_rows=512", "data.synthetic.cardinality_scale=0.002",
    "train.batch_size=128", "model.name=deepfm",
]  # fmt: skip
PRUNED = ["prune.enabled=true", "prune.chunk=2", "prune.every=4", "prune.target_ratio=4.0"]
HOT = ["dist.hot_rows=64", "dist.hot_refresh_every=3", "dist.hot_min_share=0.01"]
TIERED = ["store.enabled=true", "store.host_size=0", "store.interval=5"]
AVERAGE = ["dist.group_size=2", "dist.cross_group=average", "dist.sync_every=3"]


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_trainer_with_hot_rows_and_pruning_on_2_processes_matches_one(tmp_path: Path) -> None:
    (tmp_path / "ref-disk").mkdir()
    (tmp_path / "disk").mkdir()
    tiered = TINY + PRUNED + HOT + TIERED

    def disk(d: str, kib: int) -> list[str]:
        return [f"store.disk_path={tmp_path / d}", f"store.cache_size={kib}KiB"]

    Trainer(load_config(None, TINY + PRUNED + HOT), tmp_path / "one").fit()
    Trainer(load_config(None, tiered + disk("ref-disk", 48)), tmp_path / "one-tiered").fit()
    runs = [(TINY + PRUNED + HOT, str(tmp_path / "two")), (tiered + disk("disk", 24), str(tmp_path / "two-tiered"))]
    spawn(train_runs_worker, 2, (runs,))
    for a, b in (("one", "two"), ("one-tiered", "two-tiered")):
        compare_runs(tmp_path / a, tmp_path / b)  # rows, dims, dense weights, AUC, pruning's counts
        got = _summary(tmp_path / b)
        assert got["world_size"] == 2 and got["prune"]["pruned_chunks"] > 0


def test_trainer_with_hot_rows_and_pruning_on_a_2x2_mesh(tmp_path: Path) -> None:
    Trainer(load_config(None, TINY + PRUNED), tmp_path / "one").fit()
    runs = {
        "grad": TINY + PRUNED + HOT + ["dist.group_size=2"],  # the same hot set in every group: one process
        "avg": TINY + PRUNED + AVERAGE,
        "avg-hot": TINY + PRUNED + HOT + AVERAGE,  # hot rows change where rows live, not what averaging computes
    }
    spawn(train_runs_worker, 4, ([(v, str(tmp_path / n)) for n, v in runs.items()],), timeout_s=300)
    compare_runs(tmp_path / "one", tmp_path / "grad")
    compare_runs(tmp_path / "avg", tmp_path / "avg-hot")
    for name in runs:
        got = _summary(tmp_path / name)
        assert got["replicas"] == 2 and got["prune"]["pruned_chunks"] > 0, name
