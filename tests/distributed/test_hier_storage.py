"""Tiered, pruned and tiered-and-pruned tables on a 2x2 mesh, in both modes (each group's shard is any storage)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dist_workers import compare_rows, merge_shards
from hier_workers import hier_storage_worker
from tierec.config import load_config
from tierec.distributed import DistContext
from tierec.distributed.launch import spawn
from tierec.distributed.parallelize import check_job

NAMES = ["plain-avg", "tiered-avg", "tiered-grad", "pruned-grad", "both-grad", "pruned-avg", "both-avg"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hierstore")
    hier_storage_worker(DistContext.single(), str(out), ["tiered-grad", "pruned-grad", "both-grad"])  # references
    spawn(hier_storage_worker, 4, (str(out), NAMES), timeout_s=300)
    return out


def _load(out: Path, name: str, w: int, rank: int) -> dict:
    return torch.load(out / f"{name}-w{w}-rank{rank}.pt", weights_only=False)


@pytest.mark.parametrize("name", ["tiered-grad", "pruned-grad", "both-grad"])
def test_gradients_mode_over_any_storage_equals_one_process(runs: Path, name: str) -> None:
    ref = _load(runs, name, 1, 0)
    parts = [_load(runs, name, 4, r) for r in range(4)]
    for replica in (0, 1):  # each group holds a whole replica: one process's rows, dims and optimizer state
        got = merge_shards([parts[2 * replica]["state"], parts[2 * replica + 1]["state"]])
        want = merge_shards([ref["state"]])
        assert got.keys() == want.keys()
        for t in want:
            compare_rows(want[t], got[t], 2e-6, f"{name}/replica {replica}/{t}")
    if "pruned" in name or "both" in name:  # every rank pruned and regrew what one process did
        assert ref["steps"][-1][0] > 0 and all(p["steps"] == ref["steps"] for p in parts), (ref["steps"], parts[0]["steps"])
    if name == "tiered-grad":
        assert all(p["rows_disk"] > 0 for p in parts)  # rows of every shard live on disk


def test_average_mode_over_tiered_rows_equals_plain_rows(runs: Path) -> None:
    for r in range(4):  # the same averaging, whether the shard's rows are in memory or in tiers
        plain = merge_shards([_load(runs, "plain-avg", 4, r)["state"]])
        tiered = merge_shards([_load(runs, "tiered-avg", 4, r)["state"]])
        assert plain.keys() == tiered.keys()
        for t in plain:
            compare_rows(plain[t], tiered[t], 1e-7, f"rank {r}/{t}")


@pytest.mark.parametrize("name", ["pruned-avg", "both-avg"])
def test_average_mode_prunes_the_same_chunks_on_every_replica(runs: Path, name: str) -> None:
    parts = [_load(runs, name, 4, r) for r in range(4)]
    # synced at steps 2 and 4 (pruning steps), 3 and 6 (sync_every = 3; 6 prunes too); then at the end
    assert [s for s, _ in parts[0]["synced"]] == [2, 3, 4, 6]
    assert all(p["steps"] == parts[0]["steps"] for p in parts) and parts[0]["steps"][-1][0] > 0
    for shard in (0, 1):  # shard s of group 0 and of group 1: bit for bit after every sync, dims included
        a, b = parts[shard], parts[2 + shard]
        for (step, sa), (_, sb) in [*zip(a["synced"], b["synced"]), ((7, a["state"]), (7, b["state"]))]:
            ma, mb = merge_shards([sa]), merge_shards([sb])
            assert ma.keys() == mb.keys()
            for t in ma:
                assert ma[t].keys() == mb[t].keys(), (name, step, t)
                for i in ma[t]:
                    assert torch.equal(ma[t][i], mb[t][i]), (name, step, t, i)
    # each pruning step met its replica's budget (prune.target_ratio = 2 of one replica's rows) and used it
    assert parts[0]["budget"] == parts[1]["budget"] == parts[2]["budget"] == parts[3]["budget"]
    for value, target in parts[0]["budget"]:
        assert 0.95 * target < value <= target, parts[0]["budget"]
    assert all((p["tiers"] > 0) == (name == "both-avg") for p in parts)  # both-avg: the chunks live in a tiered store


def test_average_mode_accepts_pruning_and_hot_rows() -> None:
    ctx = DistContext(rank=0, world_size=4)
    avg = ["dist.group_size=2", "dist.cross_group=average"]
    check_job(load_config(None, avg + ["dist.hot_rows=8"]), ctx)  # hot rows average (test_hier_collection.py)
    check_job(load_config(None, avg + ["prune.enabled=true"]), ctx)
    check_job(load_config(None, avg + ["prune.enabled=true", "dist.hot_rows=8"]), ctx)  # test_hot_pruned.py
