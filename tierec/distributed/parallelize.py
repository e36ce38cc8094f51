"""parallelize: make a run's components a job's (sharded embeddings, data-parallel dense part).

The training loop is the same for any number of processes (tierec/train/trainer.py);
what differs is applied to its components here, the way torchtitan's
``parallelize`` applies parallelism to a model that knows nothing of it:

- :func:`for_process`: the config one process builds its components from: with
  tiered tables, its own directory under ``store.disk_path`` (``rank-<r>``);
  ``store.memory_budget`` is per process (each process builds its own store);
- :func:`parallelize`: new components from a run's (which are left as they
  are): every embedding collection becomes a ``ShardedEmbeddingCollection``
  over its (empty) storages, whatever they are (plain, tiered, pruned, both);
  the dense model is wrapped in DistributedDataParallel; the pruner is made
  with the job's collectives, so the budget (``prune.memory_budget`` /
  ``prune.target_ratio``) and the threshold are job-wide, and with the sharded
  collection, whose hot rows (``dist.hot_rows``) it brings to their owners for
  each step and whose replicas then take its decision (their own dims).
  With ``dist.group_size`` making several groups (Hierarchical Training), the
  same happens on the rank's group of a 2-D mesh, plus the cross-group
  synchronisation (``hierarchical.Hierarchical``, returned);
- :func:`check_job`: combinations a job cannot run, as one line naming the keys
  (``config_check.check_job_config``, which the ``--nproc N`` launcher runs before any rank starts).

Every rank reads the same global batches and keeps its slice (``data.slice_batch``);
its loss is the slice's summed loss times W / B, so DDP's average and the owners'
summed embedding gradients are the single-process ones.

>>> from tierec.config import load_config
>>> from tierec.distributed import DistContext
>>> from tierec.distributed.parallelize import for_process
>>> cfg = load_config(None, ["store.enabled=true", "store.disk_path=/tmp/rows"])
>>> for_process(cfg, DistContext.single()).store.disk_path  # one process: unchanged
'/tmp/rows'
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from tierec.config import Config
from tierec.distributed.config_check import check_job_config
from tierec.distributed.context import DistContext
from tierec.distributed.dense_sync import dense_ddp
from tierec.distributed.hierarchical import Hierarchical
from tierec.distributed.layout import Layout
from tierec.distributed.sharded import ShardedEmbeddingCollection
from tierec.distributed import wire


def process_dir(path: str, ctx: DistContext) -> str:
    """This process's own directory under ``path`` ("" stays "")."""
    return str(Path(path) / f"rank-{ctx.rank}") if path and ctx.is_distributed else path


def for_process(cfg: Config, ctx: DistContext) -> Config:
    """``cfg`` with every disk path of the store made this process's own (one process: ``cfg`` itself)."""
    if not (ctx.is_distributed and cfg.store.enabled):
        return cfg
    tables = [dataclasses.replace(t, disk_path=process_dir(t.disk_path, ctx)) for t in cfg.store.tables]
    store = dataclasses.replace(cfg.store, disk_path=process_dir(cfg.store.disk_path, ctx), tables=tables)
    for d in [store.disk_path, *(t.disk_path for t in tables)]:
        if d:
            Path(d).mkdir(parents=True, exist_ok=True)
    return dataclasses.replace(cfg, store=store)


def check_job(cfg: Config, ctx: DistContext) -> None:
    """Refuse what a job of several processes cannot run (one line naming the keys)."""
    check_job_config(cfg, ctx.world_size)


class JobSums:
    """The pruner's collectives over a job (``tierec.prune.select.JobReduce``)."""

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self.rank = ctx.rank

    def sum(self, values: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(values).copy())
        wire.all_reduce(t, self.ctx.dense_group)
        return t.numpy()

    def min(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        wire.all_reduce(t, self.ctx.dense_group, dist.ReduceOp.MIN)
        return float(t)


def parallelize(parts: Any, layout: Layout, cfg: Config) -> tuple[Any, Hierarchical | None]:
    """``parts`` (a ``Components``, left as it is) made a job's: new components whose embedding collections
    are sharded over ``layout``'s job, whose dense model is wrapped in DDP, and whose pruner prunes this
    rank's shard with the job's collectives (hot rows brought to their owners for each step).

    On a mesh of several groups (``dist.group_size``) the collections are sharded over the rank's
    group and the groups synchronised; returns that ``Hierarchical`` too (None for a flat job).
    """
    ctx = layout.job
    check_job(cfg, ctx)
    if not layout.is_flat:  # each group prunes its replica, as a job of its own
        mesh = Hierarchical(layout=layout, cfg=cfg.dist)
        return _made_parallel(parts, mesh.shard_collection, mesh.wrap_dense, JobSums(layout.group)), mesh

    def ddp(model: nn.Module) -> nn.Module:
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None  # the model is on this process's GPU
        return dense_ddp(model, ctx.dense_group, ids)

    return _made_parallel(parts, lambda coll: ShardedEmbeddingCollection(coll, ctx, cfg.dist), ddp, JobSums(ctx)), None


def _made_parallel(parts: Any, shard: Callable[[Any], ShardedEmbeddingCollection], wrap: Callable[[nn.Module], nn.Module],
                   sums: JobSums) -> Any:
    """New components from ``parts``: each embedding collection through ``shard``, the dense model through
    ``wrap``, and the pruner of this rank's shard (the local embeddings) over ``sums``, around the sharded hot rows."""
    emb = shard(parts.embeddings)
    wide = shard(parts.wide) if parts.wide is not None else None
    pruner = parts.pruner.for_job(sums, [emb]) if parts.pruner is not None else None
    return dataclasses.replace(parts, embeddings=emb, wide=wide, ddp=wrap(parts.model), pruner=pruner)


def sharded_collections(parts: Any) -> list[ShardedEmbeddingCollection]:
    return [c for c in (parts.embeddings, parts.wide) if isinstance(c, ShardedEmbeddingCollection)]
