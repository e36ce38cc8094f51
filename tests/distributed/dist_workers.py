"""Functions the distributed tests run on every spawned rank (importable by name), and their references."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tierec.batch import SparseFeatures
from tierec.config import DistConfig, OptimizerConfig, OptimizerKind, Pooling
from tierec.distributed import DistContext, ShardedEmbeddingCollection
from tierec.distributed.data import slice_bounds, slice_sparse
from tierec.embedding import EmbeddingCollection, TableConfig

FEATURES = ("a", "b", "c", "d")
GLOBAL_BATCH = 48
STEPS = 7


def make_tables() -> list[TableConfig]:
    """Two groups: a shared table (a, b) and a mean-pooled one (c) on Adam; d on row-wise Adagrad."""
    adam = OptimizerConfig(kind=OptimizerKind.ADAM, lr=0.05)
    rowwise = OptimizerConfig(kind=OptimizerKind.ROWWISE_ADAGRAD, lr=0.1)
    return [
        TableConfig(name="ab", dim=4, features=["a", "b"], optimizer=adam),
        TableConfig(name="c", dim=4, features=["c"], optimizer=adam, pooling=Pooling.MEAN),
        TableConfig(name="d", dim=4, features=["d"], optimizer=rowwise),
    ]


def make_batches(n: int = STEPS, seed: int = 0) -> list[tuple[SparseFeatures, torch.Tensor]]:
    """Skewed multi-hot batches (a few ids take most accesses) and a fixed loss weight per sample."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n + 1):  # the last one is for evaluation
        ids = []
        for f in FEATURES:
            per = []
            for _ in range(GLOBAL_BATCH):
                k = int(rng.integers(0, 4)) if f == "c" else 1
                per.append([int(np.exp(rng.uniform(0, np.log(300)))) for _ in range(k)])
            ids.append(per)
        sp = SparseFeatures.from_lists(list(FEATURES), ids)
        weight = torch.from_numpy(rng.standard_normal((GLOBAL_BATCH, len(FEATURES), 4)).astype(np.float32))
        out.append((sp, weight))
    return out


def reference(batches) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One process: the state after training on the global batches, and the eval output."""
    coll = EmbeddingCollection(make_tables(), FEATURES, seed=3)
    for sp, w in batches[:-1]:
        loss = (coll(sp) * w).sum() / GLOBAL_BATCH
        loss.backward()
    coll.eval()
    with torch.no_grad():
        out = coll(batches[-1][0])
    return coll.state_dict(), out


def collection_worker(ctx: DistContext, out_dir: str, variants: list[tuple[str, dict]]) -> None:
    """Train a sharded collection on this rank's slices; save its shard and its eval output."""
    batches = make_batches()
    w = ctx.world_size
    lo, hi = slice_bounds(GLOBAL_BATCH, w, ctx.rank)
    local = [slice_sparse(sp, lo, hi) for sp, _ in batches]
    for name, over in variants:
        coll = ShardedEmbeddingCollection(make_tables(), FEATURES, ctx, DistConfig(**over), seed=3)
        for s in range(STEPS):
            if s + 1 < STEPS:
                coll.prefetch(local[s + 1])
            loss = (coll(local[s]) * batches[s][1][lo:hi]).sum() / GLOBAL_BATCH * w
            loss.backward()
        hot = coll.hot_rows()
        coll.eval()
        with torch.no_grad():
            out = coll(local[-1])
        coll.close()
        result = {"state": coll.state_dict(), "eval": out, "hot_rows": hot, "traffic": coll.traffic.per_step()}
        torch.save(result, Path(out_dir) / f"{name}-rank{ctx.rank}.pt")


def merge_shards(states: list[dict[str, torch.Tensor]]) -> dict[str, dict[int, torch.Tensor]]:
    """{table: {id: weights ++ optimizer state}} over every shard; an id in two shards is an error."""
    merged: dict[str, dict[int, torch.Tensor]] = {}
    for sd in states:
        tables = {k[: -len(".ids")] for k in sd if k.endswith(".ids")}
        for t in tables:
            rows = merged.setdefault(t, {})
            extra = sorted(k for k in sd if k.startswith(t + ".opt."))
            vals = torch.cat([sd[f"{t}.weights"]] + [sd[k].reshape(sd[k].shape[0], -1) for k in extra], dim=1)
            for i, v in zip(sd[f"{t}.ids"].tolist(), vals):
                assert i not in rows, f"id {i} of table {t} is in two shards"
                rows[i] = v
    return merged
