"""Evaluation on several processes: each rank scores its slice of every test batch, all ranks get every score.

The metrics are the single-process ``evaluate``'s, computed on every rank from
the scores gathered in rank order.

>>> from tierec.distributed.evaluate import gather_slices
>>> from tierec.distributed import DistContext
>>> import torch
>>> gather_slices(torch.ones(3), 3, DistContext.single()).tolist()
[1.0, 1.0, 1.0]
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from tierec.config import Config
from tierec.data import BackgroundLoader, Dataset, open_dataset
from tierec.distributed.context import DistContext
from tierec.distributed.data import slice_batch, slice_bounds
from tierec.distributed import wire


def evaluate_sharded(
    cfg: Config, parts, ctx: DistContext, accumulator: Callable[[], Any], split: str = "test", data: Dataset | None = None
) -> dict[str, float]:
    """The single-process ``evaluate``: each rank scores its slice, every rank gets all scores in order.

    ``accumulator()``: a fresh metrics accumulator (``update(scores, labels)``, ``compute()``); ``data``: the
    data, already open (a column split's cutoffs, sampled negatives' passes are then not made again).
    """
    source = (data or open_dataset(cfg.data)).source(split, cfg.train.batch_size)
    acc = accumulator()
    was_training = parts.model.training
    parts.train(False)
    try:
        with torch.no_grad(), BackgroundLoader(source, depth=cfg.data.prefetch_batches) as loader:
            for i, batch in enumerate(loader):
                if cfg.train.eval_batches and i >= cfg.train.eval_batches:
                    break
                local = slice_batch(batch, ctx.world_size, ctx.rank).to(cfg.train.device)
                acc.update(gather_slices(parts.forward(local).cpu(), batch.size, ctx), batch.labels)
    finally:
        parts.train(was_training)
    return acc.compute()


def gather_slices(mine: torch.Tensor, total: int, ctx: DistContext) -> torch.Tensor:
    """Every rank's slice of a [total] vector, concatenated in rank order (on every rank)."""
    if not ctx.is_distributed:
        return mine
    size = slice_bounds(total, ctx.world_size, 0)[1]  # rank 0's slice is the largest
    padded = torch.zeros(size, dtype=mine.dtype)
    padded[: mine.shape[0]] = mine
    every = torch.empty(ctx.world_size * size, dtype=mine.dtype)
    wire.all_gather_single(every, padded, ctx.dense_group)
    parts = []
    for r in range(ctx.world_size):
        lo, hi = slice_bounds(total, ctx.world_size, r)
        parts.append(every[r * size : r * size + hi - lo])
    return torch.cat(parts)
