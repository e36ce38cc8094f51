"""`tierec train` on a 2x2 mesh over tiered and pruned tables, and dist.group_size = W against the flat run.

One spawned job of 4 ranks runs every mesh variant one after the other (``train_runs_worker``), so the
processes start once. Small runs: 12 steps of 128 rows of DeepFM (wide tables too), fp32 (``SMALL``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dist_workers import SMALL, compare_runs
from hier_workers import train_runs_worker
from tierec.config import load_config
from tierec.distributed.launch import spawn
from tierec.train.sharded_checkpoint import load_any
from tierec.train.trainer import Trainer

TINY = SMALL + [
    "data.synthetic.train_rows=1536", "data.synthetic.test_rows=512", "data.synthetic.cardinality_scale=0.002",
    "train.batch_size=128", "model.name=deepfm",
]  # fmt: skip
# most rows on disk (a small fast tier, no host tier), the prefetch pipeline, hot rows over the tiered shards
TIERED = ["store.enabled=true", "store.host_size=0", "store.interval=5"]
HOT = ["store.prefetch=true", "dist.hot_rows=64", "dist.hot_refresh_every=3", "dist.hot_min_share=0.01"]
PRUNED = ["prune.enabled=true", "prune.chunk=2", "prune.every=4", "prune.target_ratio=4.0"]
MESH = ["dist.group_size=2"]


def _cache(kib: int) -> list[str]:
    return [f"store.cache_size={kib}KiB"]


def _variants(tmp: Path) -> dict[str, list[str]]:
    """name: overrides of the 4-rank runs. A 2x2 shard's fast tier: 1/2 of one process's (a group of 2 shares
    the rows) times the 2 replicas (in gradients mode a shard updates the rows every group touched)."""
    disk = {n: [f"store.disk_path={tmp / 'disk' / n}"] for n in ("tiered", "both", "avg-both")}
    return {
        "tiered": TINY + TIERED + HOT + MESH + _cache(48) + disk["tiered"],
        "both": TINY + TIERED + PRUNED + MESH + _cache(48) + disk["both"],
        # average mode through the trainer: with and without hot rows; pruned and tiered rows, pruning at sync points
        "avg": TINY + MESH + ["dist.cross_group=average", "dist.sync_every=3"],
        "avg-hot": TINY + HOT[1:] + MESH + ["dist.cross_group=average", "dist.sync_every=3"],
        "avg-both": TINY + TIERED + PRUNED + MESH + _cache(48) + disk["avg-both"]
        + ["dist.cross_group=average", "dist.sync_every=3"],
        # group_size = W: the flat run's code path, so the flat run bit for bit
        "flat": TINY,
        "g4": TINY + ["dist.group_size=4"],
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("hiertrain")
    for d in ("ref-tiered", "ref-both", "tiered", "both", "avg-both"):
        (tmp / "disk" / d).mkdir(parents=True)
    for name, extra in (("tiered", TIERED + HOT), ("both", TIERED + PRUNED)):  # one process, the whole fast tier
        Trainer(load_config(None, TINY + extra + _cache(48) + [f"store.disk_path={tmp / 'disk' / f'ref-{name}'}"]),
                tmp / f"ref-{name}").fit()
    spawn(train_runs_worker, 4, ([(v, str(tmp / n)) for n, v in _variants(tmp).items()],), timeout_s=300)
    return tmp


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.mark.parametrize("name", ["tiered", "both"])
def test_tiered_and_pruned_trainer_on_2x2_gradients_equals_one_process(runs: Path, name: str) -> None:
    compare_runs(runs / f"ref-{name}", runs / name)  # rows, dims, optimizer state, dense weights, metrics, pruning
    got, ref = _summary(runs / name), _summary(runs / f"ref-{name}")
    assert got["replicas"] == 2 and got["embedding_rows"] == ref["embedding_rows"]
    assert got["store"]["rows_disk"] > 0  # rank 0's shard keeps rows (or chunks) on its disk
    if name == "both":
        assert got["prune"]["pruned_chunks"] > 0
        assert got["prune"]["allocated_value_bytes"] <= got["prune"]["target_bytes"]
    assert sorted(p.name for p in (runs / "disk" / name).iterdir()) == [f"rank-{r}" for r in range(4)]


def test_average_mode_with_hot_rows_and_with_pruned_tiered_tables_through_the_trainer(runs: Path) -> None:
    compare_runs(runs / "avg", runs / "avg-hot")  # hot rows change where rows live, not what averaging computes
    assert _summary(runs / "avg-hot")["replicas"] == 2
    # 12 steps of averaging every 3 cost about 0.03 AUC here (rows one group alone touched move half as far)
    got, want = _summary(runs / "avg-both"), _summary(runs / "ref-both")
    assert got["replicas"] == 2 and abs(got["test_auc"] - want["test_auc"]) < 0.05, (got["test_auc"], want["test_auc"])
    prune = _summary(runs / "avg-both")["prune"]  # one replica's budget, met after the final prune
    assert prune["pruned_chunks"] > 0 and prune["allocated_value_bytes"] <= prune["target_bytes"]
    records = [json.loads(x) for x in (runs / "avg-both" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "prune"] == [4, 8, 12]
    # its one-replica checkpoint reads on one process, with the pruned dims
    tensors, _ = load_any(runs / "avg-both" / "checkpoints")
    dims = torch.cat([v for k, v in tensors.items() if k.startswith("emb/") and k.endswith(".dims")])
    assert dims.numel() and int(dims.min()) < int(dims.max())


def test_group_size_equal_to_the_world_is_the_flat_run_bit_for_bit(runs: Path) -> None:
    a, _ = load_any(runs / "flat" / "checkpoints")
    b, _ = load_any(runs / "g4" / "checkpoints")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    sa, sb = _summary(runs / "flat"), _summary(runs / "g4")
    for k in ("test_auc", "test_logloss", "final_train_loss", "embedding_rows", "world_size"):
        assert sa[k] == sb[k], k
    assert "replicas" not in sb
