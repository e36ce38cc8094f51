"""Functions the hierarchical-training tests run on every spawned rank (importable by name), and their inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tierec.config import OptimizerConfig, OptimizerKind
from tierec.distributed import DistContext
from tierec.distributed.codecs import codec
from tierec.distributed.cross import replica_sum_rows
from tierec.distributed.dense_sync import DenseAverager, HookState, hierarchical_hook
from tierec.distributed.exchange import Traffic
from tierec.distributed.mesh import Hierarchy
from tierec.distributed.row_sync import RowAverager, RowGradientSync
from tierec.embedding.group import TableGroup
from tierec.embedding.table import TableConfig
from tierec.embedding.storage import whole_table_state

CODECS = ["none", "fp16", "bf16", "int8"]
DIM = 6


def rows_of(rank: int) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """Rank r's contribution: overlapping (table, id) sets, values of varied scale."""
    rng = np.random.default_rng(100 + rank)
    keys = rng.choice(40, size=25, replace=False).astype(np.int64)
    tabs = (keys % 2).astype(np.int32)
    vals = torch.from_numpy(rng.standard_normal((25, DIM)).astype(np.float32)) * float(rng.uniform(0.01, 3))
    return keys, tabs, vals


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 1))


def dense_data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 5, generator=g), torch.randn(8, 1, generator=g)


def _train_dense(ddp: nn.Module, rank: int, steps: int) -> list[torch.Tensor]:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    grads = []
    for s in range(steps):
        x, y = dense_data(rank, s)
        opt.zero_grad()
        ((ddp(x) - y) ** 2).mean().backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in ddp.parameters()]).clone())
        opt.step()
    return grads


def _table_group() -> TableGroup:
    adagrad = OptimizerConfig(kind=OptimizerKind.ADAGRAD, lr=0.1)
    return TableGroup([TableConfig(name="t", dim=DIM, features=["f"], optimizer=adagrad),
                       TableConfig(name="u", dim=DIM, features=["g"], optimizer=adagrad)], seed=5)


def mesh_worker(ctx: DistContext, out_dir: str, group_size: int) -> None:
    """Every phase-1 piece on a 2-D mesh; saves what the test compares."""
    h = Hierarchy.build(ctx, group_size)
    out: dict = {"replica": h.replica, "shard": h.shard}
    gctx = h.group_context(ctx)
    out["group_ctx"] = (gctx.rank, gctx.world_size)
    x = torch.tensor([float(ctx.rank)])
    dist.all_reduce(x, group=h.shard_group)
    out["shard_sum"] = float(x)
    y = torch.tensor([float(ctx.rank)])
    dist.all_reduce(y, group=h.replica_group)
    out["replica_sum"] = float(y)
    z = torch.tensor([1.0])
    dist.all_reduce(z, group=h.shard_sparse_group)
    out["sparse_size"] = float(z)

    keys, tabs, vals = rows_of(ctx.rank)
    for name in CODECS:
        k, t, s = replica_sum_rows(keys, tabs, vals, codec(name), None, h.replica_group)
        out[f"rows/{name}"] = (k, t, s)

    # gradients mode, dense: the hook against DDP's own all-reduce over the whole job
    plain = DistributedDataParallel(mlp())
    out["dense/plain"] = _train_dense(plain, ctx.rank, 3)
    for name in CODECS:
        model = DistributedDataParallel(mlp())
        state = HookState(hier=h, codec=codec(name))
        model.register_comm_hook(state, hierarchical_hook)
        out[f"dense/{name}"] = _train_dense(model, ctx.rank, 3)
        out[f"dense_traffic/{name}"] = dict(state.traffic.bytes_sent)

    # average mode, dense: replicas diverge, then average
    for name in CODECS:
        net = mlp()
        avg = DenseAverager(list(net.parameters()), codec(name), h.replica_group, Traffic())
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.01 * (h.replica + 1))
        before = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).clone()
        avg.sync()
        out[f"avg/{name}"] = (before, torch.cat([p.detach().reshape(-1) for p in net.parameters()]).clone())

    # embedding rows, both modes
    for name in CODECS:
        grp = _table_group()
        rows = grp.lookup(keys, tabs, insert=True)
        gsync = RowGradientSync(grp, codec(name), h.replica_group)
        urows, sums, _ = gsync.reduce(keys, tabs, vals)
        out[f"rowgrad/{name}"] = (grp.index.row_keys[urows.numpy()].copy(), sums)

        grp = _table_group()
        averager = RowAverager(grp, codec(name), h.replica_group)
        for step in range(2):  # two updates between syncs, on rows that differ per replica
            sel = slice(step * 5, step * 5 + 15)
            r = grp.lookup(keys[sel], tabs[sel], insert=True)
            averager.touch(keys[sel], tabs[sel])
            grp.update(r, vals[sel])
        before = {n: whole_table_state(grp, t) for t, n in enumerate(("t", "u"))}
        averager.sync()
        after = {n: whole_table_state(grp, t) for t, n in enumerate(("t", "u"))}
        out[f"rowavg/{name}"] = (before, after)
    torch.save(out, Path(out_dir) / f"rank{ctx.rank}.pt")


def hier_collection_worker(ctx: DistContext, out_dir: str, variants: list[tuple[str, dict]]) -> None:
    """dist_workers.collection_worker on a 2-D mesh: the sharded collection with cross-group sync."""
    from dist_workers import FEATURES, STEPS, make_batches, make_tables
    from tierec.config import DistConfig
    from tierec.distributed.data import slice_bounds, slice_sparse
    from tierec.distributed.hierarchical import Hierarchical
    from tierec.embedding import EmbeddingCollection

    batches = make_batches()
    w = ctx.world_size
    bounds = [slice_bounds(sp.batch_size, w, ctx.rank) for sp, _ in batches]
    local = [slice_sparse(sp, lo, hi) for (sp, _), (lo, hi) in zip(batches, bounds)]
    for name, over in variants:
        cfg = DistConfig(group_size=2, **over)
        h = Hierarchical.build(ctx, cfg)
        coll = h.shard_collection(EmbeddingCollection(make_tables(), FEATURES, seed=3))
        prepared = coll.prepare(local[0])
        for s in range(STEPS):
            upcoming = coll.prepare(local[s + 1]) if s + 1 < STEPS else None  # posted before this batch's forward
            lo, hi = bounds[s]
            loss = (coll(local[s], prepared) * batches[s][1][lo:hi]).sum() / batches[s][0].batch_size * w
            loss.backward()
            prepared = upcoming
            h.after_step()
        h.sync_now()
        hot = coll.hot_rows()
        coll.close()
        result = {"state": coll.state_dict(), "hot_rows": hot, "moves": coll.hot_moves(), "traffic": coll.traffic.per_step(),
                  "bytes": h.bytes_per_step()}
        torch.save(result, Path(out_dir) / f"{name}-rank{ctx.rank}.pt")


# ------------------------------------------------------------------ storages on a mesh

STORAGE_VARIANTS = {  # name: (tiered, pruned, cross_group)
    "plain-avg": (False, False, "average"),
    "tiered-avg": (True, False, "average"),
    "tiered-grad": (True, False, "gradients"),
    "pruned-grad": (False, True, "gradients"),
    "both-grad": (True, True, "gradients"),
    "pruned-avg": (False, True, "average"),
    "both-avg": (True, True, "average"),
}
PRUNE_AT = (2, 4, 6)  # steps after which the pruner runs


def storage_collection(disk: str, tiered: bool, pruned: bool, world: int):
    """The 3-table collection of dist_workers over a small fast tier (most rows on disk) and / or chunked rows.

    ``world``: the ranks the rows are sharded over (a group of the mesh), each with 1/world of the fast tier.
    """
    from dist_workers import FEATURES, make_tables
    from tierec.config import PruneConfig, StoreConfig
    from tierec.embedding import EmbeddingCollection
    from tierec.storage import storage_factory
    from tierec.store.plan import StorePlan

    store = StoreConfig(enabled=tiered, cache_size=f"{12 / world}KiB", host_size=0, disk_path=disk)
    prune = PruneConfig(enabled=True, chunk=2, target_ratio=2.0) if pruned else None
    Path(disk).mkdir(parents=True, exist_ok=True)
    tables = make_tables()
    plan = StorePlan(store, [tables])
    return EmbeddingCollection(plan.tables(tables), FEATURES, seed=3, group_factory=storage_factory(plan, prune)), prune


def hier_storage_worker(ctx: DistContext, out_dir: str, names: list[str]) -> None:
    """Each storage variant trained on this rank's slices: on a 2x2 mesh, or (W = 1) the one-process reference."""
    from dist_workers import STEPS, make_batches
    from tierec.config import DistConfig
    from tierec.distributed.data import slice_bounds, slice_sparse
    from tierec.distributed.hierarchical import Hierarchical
    from tierec.distributed.parallelize import JobSums
    from tierec.prune import Pruner

    batches = make_batches()
    w = ctx.world_size
    bounds = [slice_bounds(sp.batch_size, w, ctx.rank) for sp, _ in batches]
    local = [slice_sparse(sp, lo, hi) for (sp, _), (lo, hi) in zip(batches, bounds)]
    for name in names:
        tiered, pruned, mode = STORAGE_VARIANTS[name]
        coll, prune = storage_collection(str(Path(out_dir) / "disk" / name / f"rank-{ctx.rank}"), tiered, pruned, min(w, 2))
        # averaging every 3 steps; pruning after steps 2, 4 and 6, so steps 2 and 4 are sync points only for it
        h = Hierarchical.build(ctx, DistConfig(group_size=2, cross_group=mode, sync_every=3)) if w > 1 else None
        model = h.shard_collection(coll) if h is not None else coll
        job = JobSums(h.group_ctx) if h is not None else None
        pruner = Pruner(coll, prune, job=job) if prune else None
        steps, synced, budget = [], [], []
        for s in range(STEPS):
            lo, hi = bounds[s]
            loss = (model(local[s]) * batches[s][1][lo:hi]).sum() / batches[s][0].batch_size * w
            loss.backward()
            if h is not None:
                h.after_step()
            if pruner is not None and s + 1 in PRUNE_AT:
                if h is not None:
                    h.sync_now()  # a pruning step is a sync point (the trainer's Job.settle)
                st = pruner.step()
                steps.append((st.pruned, st.regrown))
                budget.append((st.value_bytes, st.target_bytes))
            if pruner is not None and mode == "average" and h is not None and h.synced_at == h.steps:
                synced.append((s + 1, model.state_dict()))  # after each sync (and pruning step)
        if h is not None:
            h.sync_now()
            model.close()
        disk = [st for g in coll.groups for st in g.tier_stores()]
        result = {"state": model.state_dict(), "steps": steps, "synced": synced, "budget": budget, "tiers": len(disk),
                  "rows_disk": sum(x["rows_disk"] for g in disk for x in g.stats().values())}
        for g in coll.groups:
            g.close()
        torch.save(result, Path(out_dir) / f"{name}-w{w}-rank{ctx.rank}.pt")


def train_runs_worker(ctx: DistContext, runs: list[tuple[list[str], str]]) -> None:
    """Several `tierec train` runs (overrides, run directory) one after the other in the same job."""
    from tierec.config import load_config
    from tierec.train.launch import train_in_job

    for overrides, run_dir in runs:
        train_in_job(ctx, load_config(None, overrides), Path(run_dir), resume=False)
