"""What the hot-rows-with-pruning tests run on every spawned rank (importable by name), and its reference."""

from __future__ import annotations

from pathlib import Path

import torch

from dist_workers import FEATURES, STEPS, make_batches, make_tables
from tierec.config import DistConfig, PruneConfig, StoreConfig
from tierec.distributed import DistContext, ShardedEmbeddingCollection
from tierec.distributed.data import slice_bounds, slice_sparse
from tierec.distributed.parallelize import JobSums, process_dir
from tierec.embedding import EmbeddingCollection
from tierec.prune import Pruner
from tierec.storage import storage_factory
from tierec.store.plan import StorePlan

# the hottest rows replicated from step 2 on, refreshed every 2 steps; pruning after steps 2, 4 and 6
HOT = DistConfig(hot_rows=16, hot_refresh_every=2, hot_min_share=0.01)
PRUNE_AT = (2, 4, 6)


def pruned_collection(tiered: bool, disk: str, ctx: DistContext,
                      target_ratio: float) -> tuple[EmbeddingCollection, PruneConfig]:
    """The 3-table collection of dist_workers as chunked rows (dim 4 in chunks of 2), in memory or tiered
    (each of W processes 1/W of a small fast tier, most chunks on disk)."""
    store = StoreConfig(enabled=tiered, cache_size=f"{8 / ctx.world_size}KiB", host_size=0,
                        disk_path=process_dir(disk, ctx))
    Path(store.disk_path).mkdir(parents=True, exist_ok=True)
    prune = PruneConfig(enabled=True, chunk=2, target_ratio=target_ratio)
    tables = make_tables()
    plan = StorePlan(store, [tables])
    return EmbeddingCollection(plan.tables(tables), FEATURES, seed=3, group_factory=storage_factory(plan, prune)), prune


def row_dims(coll: EmbeddingCollection) -> dict[tuple[int, int, int], int]:
    """{(group, table, id): dims} of every row of a one-process pruned collection."""
    out = {}
    for gi, g in enumerate(coll.groups):
        p = g.pruning()
        n = p.num_rows
        for t, k, c in zip(p.index.row_tabs[:n].tolist(), p.index.row_keys[:n].tolist(), p.live_chunks().tolist()):
            out[(gi, t, k)] = c * p.chunk
    return out


def replica_dims(coll: ShardedEmbeddingCollection) -> dict[tuple[int, int, int], int]:
    """{(group, table, id): dims} of every hot row, as this rank's replica holds it (a record's last column)."""
    out = {}
    for gi, shard in enumerate(coll.shards):
        hot = shard.hot
        found, rec = hot.group.records_of(hot.keys, hot.tabs)
        assert found.all()
        for t, k, d in zip(hot.tabs.tolist(), hot.keys.tolist(), rec[:, -1].tolist()):
            out[(gi, t, k)] = int(d)
    return out


def hot_pruned_worker(ctx: DistContext, out_dir: str, names: list[str], target_ratio: float) -> None:
    """Each variant ("pruned", "tiered") trained on this rank's slices with hot rows and pruning (W = 1:
    the plain collection on whole batches, the reference); saves the rows, the pruning steps and the dims."""
    batches = make_batches()
    w = ctx.world_size
    bounds = [slice_bounds(sp.batch_size, w, ctx.rank) for sp, _ in batches]
    local = [slice_sparse(sp, lo, hi) for (sp, _), (lo, hi) in zip(batches, bounds)]
    for name in names:
        coll, prune = pruned_collection(name == "tiered", str(Path(out_dir) / "disk" / name), ctx, target_ratio)
        sharded = ShardedEmbeddingCollection(coll, ctx, HOT) if ctx.is_distributed else None
        model = sharded or coll
        if sharded is not None:  # the pruner brings the hot rows to their owners for each step
            pruner = Pruner(coll, prune, job=JobSums(ctx), replicated=[sharded])
        else:
            pruner = Pruner(coll, prune)
        steps, dims, hot_sizes = [], [], []
        prepared = sharded.prepare(local[0]) if sharded is not None else None
        for s in range(STEPS - 1):
            upcoming = None
            if sharded is not None and s + 1 < STEPS - 1:
                upcoming = sharded.prepare(local[s + 1])  # split hot / cold before the pruning step that may change the set
            lo, hi = bounds[s]
            emb = model(local[s]) if prepared is None else sharded(local[s], prepared)
            prepared = upcoming
            loss = (emb * batches[s][1][lo:hi]).sum() / batches[s][0].batch_size * w
            loss.backward()
            if s + 1 in PRUNE_AT:
                hot_sizes.append(sharded.hot_rows() if sharded is not None else 0)
                st = pruner.step()
                steps.append((st.pruned, st.regrown, st.threshold))
                dims.append(replica_dims(sharded) if sharded is not None else row_dims(coll))
        model.eval()
        with torch.no_grad():
            out = model(local[-1])
        result = {"state": model.state_dict(), "eval": out, "steps": steps, "dims": dims, "hot_sizes": hot_sizes,
                  "moves": sharded.hot_moves() if sharded is not None else None,
                  "hist": {k: v for k, v in pruner.stats()["dim_hist"].items()}}
        if sharded is not None:
            sharded.close()
        for g in coll.groups:
            g.close()
        torch.save(result, Path(out_dir) / f"{name}-w{w}-rank{ctx.rank}.pt")
