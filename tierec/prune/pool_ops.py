"""Gather + pool of a pruned group's unique rows through their chunk maps.

The same two paths as tierec/embedding/pool_ops.py, reading chunks instead of
dense rows: ``pool_chunked`` (numba: the forward reads each row's live chunks
straight into the output, dims past its prefix stay zero; the backward reduces
the output gradient onto the unique rows with the engine's own kernel and
hands it to ``group.update``, the chunked fused optimizer) and
``pool_chunked_torch`` (gathers dense ``[U, D]`` rows, then ``embedding_bag``;
for checking the fused path).

The gradient of a pruned dim is still formed (it is the gradient of a zero
input): the update does not apply it, it only adds its norm to the row's claim
to grow that chunk back.

>>> import torch
>>> from tierec.batch import SparseFeatures
>>> from tierec.config import PruneConfig
>>> from tierec.embedding import EmbeddingCollection, TableConfig
>>> from tierec.storage import storage_factory
>>> coll = EmbeddingCollection([TableConfig(name="t", dim=8, features=["f"])], ["f"],
...                            group_factory=storage_factory(prune=PruneConfig(chunk=4)))
>>> out = coll(SparseFeatures.one_hot(("f",), torch.tensor([[3], [4]])))  # pool_chunked
>>> out.sum().backward()  # the chunked fused optimizer ran
>>> out.shape
torch.Size([2, 1, 8])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tierec.embedding.pool_ops import BagLayout, pool_backward_auto

PrunedGroup = Any  # tierec.prune.group.PrunedGroup (the module imports this one)
ChunkView = Any  # tierec.prune.chunk_pool.ChunkView


def _forward(group: PrunedGroup, layout: BagLayout, view: ChunkView) -> Tensor:
    out = torch.empty(layout.batch, layout.n_features, group.dim)  # [B, F_g, D]
    group.kernels.pool_forward(
        view.arrays["weights"], view.cmap, view.rows, view.start, view.length,
        layout.inverse, layout.offsets, layout.scale, layout.batch, out.numpy(),
    )  # fmt: skip
    return out


class _PoolChunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor: Tensor, group: PrunedGroup, rows: np.ndarray, layout: BagLayout) -> Tensor:
        view = group.view(rows)  # the chunk maps (and tiered slots) do not change before this batch's backward
        ctx.args = (group, rows, layout, view)
        return _forward(group, layout, view)

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # grad_out [B, F_g, D]
        group, rows, layout, view = ctx.args
        grad_rows = torch.zeros(rows.shape[0], group.dim)  # [U, D]
        g = grad_out.contiguous().numpy()
        pool_backward_auto(g, layout, grad_rows.numpy())  # split by feature where the layout allows
        group.update(torch.from_numpy(rows), grad_rows, view, hits=accesses(layout, rows.shape[0]))
        return None, None, None, None


class _GatherChunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor: Tensor, group: PrunedGroup, rows: Tensor, hits: np.ndarray) -> Tensor:
        ctx.group, ctx.hits = group, hits
        ctx.save_for_backward(rows)
        return group.gather(rows.numpy())

    @staticmethod
    def backward(ctx, grad: Tensor):  # [U, D], summed over duplicates
        (rows,) = ctx.saved_tensors
        ctx.group.update(rows, grad, hits=ctx.hits)
        return None, None, None, None


def accesses(layout: BagLayout, n_rows: int) -> np.ndarray:
    """[U] float32: how many of the batch's ids each unique row serves (its accesses this step)."""
    return np.bincount(layout.inverse, minlength=n_rows).astype(np.float32)


def pool_chunked(group: PrunedGroup, rows: np.ndarray, layout: BagLayout, train: bool, anchor: Tensor) -> Tensor:
    """``rows`` [U] may hold -1 (unknown id at evaluation), which pools as zeros."""
    if train:
        return _PoolChunked.apply(anchor, group, rows, layout)
    return _forward(group, layout, group.view(rows))


def pool_chunked_torch(group: PrunedGroup, rows: np.ndarray, layout: BagLayout, train: bool, anchor: Tensor) -> Tensor:
    r = torch.from_numpy(rows)
    emb = _GatherChunked.apply(anchor, group, r, accesses(layout, rows.shape[0])) if train else group.gather(rows)  # [U, D]
    weights = None
    if bool((layout.scale != 1.0).any()):
        lengths = torch.from_numpy(np.diff(layout.offsets))
        weights = torch.from_numpy(layout.scale).repeat_interleave(lengths)
    pooled = F.embedding_bag(
        torch.from_numpy(layout.inverse),
        emb,
        torch.from_numpy(layout.offsets),
        mode="sum",
        per_sample_weights=weights,
        include_last_offset=True,
    )
    return pooled.view(layout.n_features, layout.batch, -1).transpose(0, 1)  # [B, F_g, D]
