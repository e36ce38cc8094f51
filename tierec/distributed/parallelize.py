"""parallelize: make a run's components a job's (sharded embeddings, data-parallel dense part).

The training loop is the same for any number of processes (tierec/train/trainer.py);
what differs is applied to its components here, the way torchtitan's
``parallelize`` applies parallelism to a model that knows nothing of it:

- :func:`for_process`: the config one process builds its components from: with
  tiered tables, its own directory under ``store.disk_path`` (``rank-<r>``);
  ``store.memory_budget`` is per process (each process builds its own store);
- :func:`parallelize`: every embedding collection becomes a
  ``ShardedEmbeddingCollection`` over its (empty) storages, whatever they are
  (plain, tiered, pruned, both); the dense model is wrapped in
  DistributedDataParallel; the pruner gets the job's collectives, so the budget
  (``prune.memory_budget`` / ``prune.target_ratio``) and the threshold are job-wide.
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
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tierec.config import Config, ConfigError
from tierec.distributed.config_check import check_job_config
from tierec.distributed.context import DistContext
from tierec.distributed.hierarchical import Hierarchical
from tierec.distributed.layout import Layout
from tierec.distributed.sharded import ShardedEmbeddingCollection


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
    if ctx.device.type != "cpu":
        raise ConfigError(f"train.device: distributed training runs on the CPU (gloo) for now, not on {ctx.device}")
    check_job_config(cfg, ctx.world_size)


class JobSums:
    """The pruner's collectives over a job (``tierec.prune.select.JobReduce``)."""

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self.rank = ctx.rank

    def sum(self, values: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(values).copy())
        dist.all_reduce(t, group=self.ctx.dense_group)
        return t.numpy()

    def min(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.ctx.dense_group)
        return float(t)


def parallelize(parts: Any, layout: Layout, cfg: Config) -> Hierarchical | None:
    """Shard ``parts``' embedding collections over ``layout``'s job, wrap its dense model in DDP (in place).

    On a mesh of several groups (``dist.group_size``) the collections are sharded over the rank's
    group and the groups synchronised; returns that ``Hierarchical`` (None for a flat job).
    """
    ctx = layout.job
    check_job(cfg, ctx)
    if not layout.is_flat:
        mesh = Hierarchical(layout=layout, cfg=cfg.dist)
        mesh.apply(parts)
        if parts.pruner is not None:
            parts.pruner.job = JobSums(layout.group)  # each group prunes its replica, as a job of its own
        return mesh
    parts.embeddings = ShardedEmbeddingCollection(parts.embeddings, ctx, cfg.dist)
    if parts.wide is not None:
        parts.wide = ShardedEmbeddingCollection(parts.wide, ctx, cfg.dist)
    parts.ddp = DistributedDataParallel(parts.model, process_group=ctx.dense_group, forward_sync_buffers=False)
    if parts.pruner is not None:
        parts.pruner.job = JobSums(ctx)  # it keeps the shard's collection: its groups are this rank's rows
    return None


def sharded_collections(parts: Any) -> list[ShardedEmbeddingCollection]:
    return [c for c in (parts.embeddings, parts.wide) if isinstance(c, ShardedEmbeddingCollection)]
