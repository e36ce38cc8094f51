"""Every storage on several processes: tiered, pruned and tiered-and-pruned tables give one process's numbers.

On the same global batches, 2 processes end with the same rows, optimizer state,
row dims and metrics as one process: the sharded collection over each storage,
and the whole trainer on 2 and 4 processes. A run with tiered and pruned tables
interrupted on 4 processes resumes on 2 and on 1 to the uninterrupted run's end.
Each process tiers its shard with its own ``store`` budget and its own directory
under ``store.disk_path``; pruning's budget and threshold are job-wide.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dist_workers import (
    FEATURES, SMALL, compare_rows, compare_runs, interrupted_worker, make_batches, make_tables, merge_shards, train_worker,
)
from tierec.config import ConfigError, DistConfig, PruneConfig, StoreConfig, load_config
from tierec.distributed import DistContext, ShardedEmbeddingCollection
from tierec.distributed.data import slice_bounds, slice_sparse
from tierec.distributed.launch import spawn
from tierec.distributed.parallelize import JobSums, check_job, process_dir
from tierec.embedding import EmbeddingCollection
from tierec.prune import Pruner
from tierec.storage import storage_factory
from tierec.store.plan import StorePlan
from tierec.train.trainer import Trainer

# Most rows on disk: a small fast tier (per process), no host tier; pruning to a quarter, job-wide.
TIERED = ["store.enabled=true", "store.cache_size=48KiB", "store.host_size=8KiB"]
PRUNED = ["prune.enabled=true", "prune.chunk=2", "prune.every=4", "prune.target_ratio=4.0"]

# ------------------------------------------------------------------ collections


def _variant(name: str, disk: str, world: int = 1) -> tuple[StoreConfig, PruneConfig | None, DistConfig]:
    """A variant's store (each of W processes gets 1/W of the fast tier), pruning and distribution."""
    store = StoreConfig(enabled=True, cache_size=f"{8 / world}KiB", host_size=0, disk_path=disk)
    prune = PruneConfig(enabled=True, chunk=2, target_ratio=2.0)
    hot = DistConfig(hot_rows=16, hot_refresh_every=2, hot_min_share=0.01)
    return {
        "tiered": (store, None, hot),  # hot rows replicated over a tiered shard
        "pruned": (StoreConfig(), prune, DistConfig()),
        "both": (store, prune, DistConfig()),
    }[name]


def _collection(name: str, disk: str, ctx: DistContext) -> tuple[EmbeddingCollection, PruneConfig | None]:
    store, prune, _ = _variant(name, process_dir(disk, ctx), ctx.world_size)
    Path(store.disk_path or disk).mkdir(parents=True, exist_ok=True)
    tables = make_tables()
    plan = StorePlan(store, [tables])
    return EmbeddingCollection(plan.tables(tables), FEATURES, seed=3, group_factory=storage_factory(plan, prune)), prune


PRUNE_AT = (2, 4, 6)  # steps after which the pruner runs


def storage_worker(ctx: DistContext, out_dir: str, names: list[str]) -> None:
    """Train each variant on this rank's slices (W = 1: the reference on whole batches); save the rows."""
    batches = make_batches()
    w = ctx.world_size
    bounds = [slice_bounds(sp.batch_size, w, ctx.rank) for sp, _ in batches]
    local = [slice_sparse(sp, lo, hi) for (sp, _), (lo, hi) in zip(batches, bounds)]
    for name in names:
        coll, prune = _collection(name, str(Path(out_dir) / "disk" / name), ctx)
        sharded = ShardedEmbeddingCollection(coll, ctx, _variant(name, "")[2]) if ctx.is_distributed else None
        model = sharded or coll
        pruner = Pruner(coll, prune, job=JobSums(ctx) if ctx.is_distributed else None) if prune else None
        steps = []
        for s in range(len(batches) - 1):
            lo, hi = bounds[s]
            loss = (model(local[s]) * batches[s][1][lo:hi]).sum() / batches[s][0].batch_size * w
            loss.backward()
            if pruner is not None and s + 1 in PRUNE_AT:
                st = pruner.step()
                steps.append((st.pruned, st.regrown, st.threshold))
        model.eval()
        with torch.no_grad():
            out = model(local[-1])
        disk = [s for g in coll.groups for s in g.tier_stores()]
        result = {
            "state": model.state_dict(), "eval": out, "steps": steps,
            "rows_disk": sum(st["rows_disk"] for g in disk for st in g.stats().values()),
            "rows_cache": sum(st["rows_cache"] for g in disk for st in g.stats().values()),
            "hot_moves": sharded.hot_moves() if sharded is not None else None,
        }
        if sharded is not None:
            sharded.close()
        for g in coll.groups:
            g.close()
        torch.save(result, Path(out_dir) / f"{name}-w{w}-rank{ctx.rank}.pt")


def test_tiered_pruned_and_both_shards_match_one_process(tmp_path: Path) -> None:
    names = ["tiered", "pruned", "both"]
    storage_worker(DistContext.single(), str(tmp_path), names)
    spawn(storage_worker, 2, (str(tmp_path), names))
    batches = make_batches()
    for name in names:
        ref = torch.load(tmp_path / f"{name}-w1-rank0.pt", weights_only=False)
        parts = [torch.load(tmp_path / f"{name}-w2-rank{r}.pt", weights_only=False) for r in range(2)]
        ra, rb = merge_shards([ref["state"]]), merge_shards([p["state"] for p in parts])
        assert ra.keys() == rb.keys()
        for t in ra:
            compare_rows(ra[t], rb[t], 2e-5, f"{name}/{t}")
        # the pruner freed and regrew the same chunks, with the same threshold, on every rank
        assert parts[0]["steps"] == parts[1]["steps"]
        assert [s[:2] for s in parts[0]["steps"]] == [s[:2] for s in ref["steps"]]
        for (_, _, a), (_, _, b) in zip(ref["steps"], parts[0]["steps"]):
            assert a == pytest.approx(b, rel=1e-4)
        # evaluation on each rank's slice: the single process's output, slice by slice
        n = batches[-1][0].batch_size
        for r, p in enumerate(parts):
            lo, hi = slice_bounds(n, 2, r)
            torch.testing.assert_close(p["eval"], ref["eval"][lo:hi], rtol=1e-4, atol=2e-5)
        if name != "pruned":  # rows on disk (most of them, for whole rows), in each process's own directory
            assert all(p["rows_disk"] > (p["rows_cache"] if name == "tiered" else 0) for p in parts), name
            assert sorted(x.name for x in (tmp_path / "disk" / name).iterdir()) == ["rank-0", "rank-1"]
        if name == "pruned":
            assert ref["steps"][-1][0] > 0  # it did prune
    assert parts and torch.load(tmp_path / "tiered-w2-rank0.pt", weights_only=False)["hot_moves"]["joined"] > 0


# ------------------------------------------------------------------ the trainer


def test_a_bad_combination_is_one_line_naming_the_keys() -> None:
    cfg = load_config(None, PRUNED + ["dist.backend=nccl"])
    with pytest.raises(ConfigError, match=r"dist\.backend"):
        check_job(cfg, DistContext.single())
    check_job(load_config(None, PRUNED + TIERED), DistContext.single())  # the combination the docs describe
    check_job(load_config(None, PRUNED + TIERED + ["dist.hot_rows=8"]), DistContext.single())  # hot rows with them


def _store_summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_tiered_trainer_with_prefetch_and_hot_rows_on_2_and_4_matches_one_process(tmp_path: Path) -> None:
    # deepfm (first-order "wide" tables too), most rows on disk, prefetch pipeline, hot rows over tiered shards;
    # fp32 (SMALL): under bf16 autocast W ranks' partial sums round differently, with any storage.
    # Each of W processes gets 1/W of the fast tier (store sizes are per process).
    over = SMALL + [
        "data.synthetic.train_rows=1536", "data.synthetic.test_rows=512", "data.synthetic.cardinality_scale=0.002",
        "train.batch_size=128", "model.name=deepfm",
        "store.enabled=true", "store.host_size=0", "store.interval=5", "store.prefetch=true",
        "dist.hot_rows=64", "dist.hot_refresh_every=3", "dist.hot_min_share=0.01",
    ]  # fmt: skip
    for d in ("d1", "d2", "d4"):
        (tmp_path / d).mkdir()

    def tiers(w: int) -> list[str]:
        # on 2 processes with a horizon (store.horizon): its rows used soon stay in memory, and rank 0 then
        # reads nothing ahead; on 4 without one; fp32 rows, so it changes no number either way
        return over + [f"store.cache_size={48 // w}KiB", f"store.disk_path={tmp_path / f'd{w}'}"] \
            + ["store.horizon=128"] * (w == 2)

    Trainer(load_config(None, tiers(1)), tmp_path / "one").fit()
    for w in (2, 4):
        spawn(train_worker, w, (tiers(w), str(tmp_path / f"w{w}"), False))
        compare_runs(tmp_path / "one", tmp_path / f"w{w}")
        assert sorted(p.name for p in (tmp_path / f"d{w}").iterdir()) == [f"rank-{r}" for r in range(w)]
        store = _store_summary(tmp_path / f"w{w}")["store"]  # rank 0's tiers: most rows on disk, some read ahead
        assert store["rows_disk"] > store["rows_cache"] and store["disk_read_rows"] > 0, store
        if w == 4:
            assert store["pipeline"]["staged_rows"] > 0, store
        else:
            assert store["pipeline"]["horizon"] == 128 and store["pipeline"]["foresee_s"] > 0, store


def test_tiered_and_pruned_interrupted_at_4_resume_at_2_and_at_1(tmp_path: Path) -> None:
    # prune.final_prune stays on: the uninterrupted run prunes once more at its end, the interrupted one
    # saves its state at step 5 as it is (docs/pruning.md, "Final prune").
    # Each of W processes gets 1/W of the fast tier (store sizes are per process).
    over = SMALL + TIERED + PRUNED
    for d in ("ref", "disk"):
        (tmp_path / d).mkdir()
    Trainer(load_config(None, over + [f"store.disk_path={tmp_path / 'ref'}"]), tmp_path / "reference").fit()
    over = over + [f"store.disk_path={tmp_path / 'disk'}"]

    def tiers(w: int) -> list[str]:
        return over + [f"store.cache_size={48 // w}KiB", f"store.host_size={8 // w}KiB"]

    spawn(interrupted_worker, 4, (tiers(4), str(tmp_path / "two"), 5))
    ckpt = tmp_path / "two" / "checkpoints" / "step_00000005"
    assert json.loads((ckpt / "meta.json").read_text())["_checkpoint"]["world_size"] == 4
    assert sorted(p.name for p in (tmp_path / "disk").iterdir()) == [f"rank-{r}" for r in range(4)]
    shutil.copytree(tmp_path / "two", tmp_path / "one")
    spawn(train_worker, 2, (tiers(2), str(tmp_path / "two"), True))  # ... resumed on 2 to the end
    compare_runs(tmp_path / "reference", tmp_path / "two")
    Trainer(load_config(None, tiers(1)), tmp_path / "one", resume=True).fit()  # ... and on 1
    compare_runs(tmp_path / "reference", tmp_path / "one")
    summary = _store_summary(tmp_path / "two")
    assert summary["world_size"] == 2 and summary["prune"]["pruned_chunks"] > 0
    assert summary["store"]["rows_disk"] > 0 and summary["store"]["disk_read_rows"] > 0  # rank 0's chunks, on its disk
