"""Gather + pool of a batch's unique rows, with the fused optimizer as the backward.

Two interchangeable paths produce ``[B, F_g, D]`` for one table group:

- ``pool_fused`` (CPU): numba kernels read rows straight from the table into
  the output and reduce the output gradient onto the unique rows;
- ``pool_torch`` (any device, the GPU path): ``index_select`` of the unique
  rows, then ``embedding_bag``; autograd reduces the gradient.

Both hand the reduced gradient ``[U, D]`` of the unique rows to
``group.update``; neither forms a dense gradient of a table. ``pool_dense``
picks one: what every storage of whole rows calls from its ``pool``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tierec.embedding.pooling import backward_chunks, pool_backward, pool_backward_by_feature, pool_forward


class DenseRows(Protocol):
    """What these paths read of a storage of whole rows (a TableGroup, or a TieredGroup's fast tier)."""

    weights: Tensor  # [R, D]
    dim: int
    device: torch.device

    def update(self, rows: Tensor, grad: Tensor) -> None: ...

    def fused_reduce_update(self, features_own_rows: bool = False) -> bool: ...

    def reduce_update(self, grad_out: np.ndarray, rows: np.ndarray, layout: BagLayout) -> None: ...


@dataclass(frozen=True)
class BagLayout:
    """Where a group's ids sit in the batch, as positions into the unique rows."""

    inverse: np.ndarray  # [N] int64, id occurrence -> unique row position
    offsets: np.ndarray  # [F_g * B + 1] int64, bag f*B+b owns inverse[offsets[k]:offsets[k+1]]
    scale: np.ndarray  # [F_g * B] float32, 1 for sum pooling, 1/len for mean
    batch: int
    # [P+1] feature boundaries of a by-feature split between threads (pooling.feature_bounds), or
    # None: only when no unique row is used by two features (one table per feature)
    feature_split: np.ndarray | None = None

    @property
    def n_features(self) -> int:
        return (self.offsets.shape[0] - 1) // self.batch


def pool_backward_auto(grad_out: np.ndarray, layout: BagLayout, grad_rows: np.ndarray) -> None:
    """The backward onto unique rows, split between threads by feature where the layout has a
    split (``pool_backward_by_feature``), else by column (``pool_backward``); the same sums either way."""
    if layout.feature_split is not None:
        pool_backward_by_feature(
            grad_out, layout.inverse, layout.offsets, layout.scale, layout.batch, layout.feature_split, grad_rows
        )
        return
    n = backward_chunks(grad_rows.shape[1])
    pool_backward(grad_out, layout.inverse, layout.offsets, layout.scale, layout.batch, n, grad_rows)


class _Gather(torch.autograd.Function):
    """Gather unique rows [U, D]; the backward is the fused optimizer step on those rows."""

    @staticmethod
    def forward(ctx, anchor: Tensor, group: DenseRows, rows: Tensor) -> Tensor:
        ctx.group = group
        ctx.save_for_backward(rows)
        return group.weights.index_select(0, rows)

    @staticmethod
    def backward(ctx, grad: Tensor):  # grad [U, D], already summed over duplicates
        (rows,) = ctx.saved_tensors
        ctx.group.update(rows, grad)
        return None, None, None


class _PoolFused(torch.autograd.Function):
    """CPU gather + pool in one numba pass; the backward reduces onto unique rows and updates them."""

    @staticmethod
    def forward(ctx, anchor: Tensor, group: DenseRows, rows: np.ndarray, layout: BagLayout) -> Tensor:
        out = torch.empty(layout.batch, layout.n_features, group.dim)  # [B, F_g, D]
        pool_forward(group.weights.numpy(), rows, layout.inverse, layout.offsets, layout.scale, layout.batch, out.numpy())
        ctx.args = (group, rows, layout)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # grad_out [B, F_g, D]
        group, rows, layout = ctx.args
        g = grad_out.contiguous().numpy()
        if group.fused_reduce_update(layout.feature_split is not None):  # one row-parallel pass, bitwise the same result
            group.reduce_update(g, rows, layout)
            return None, None, None, None
        grad_rows = torch.zeros(rows.shape[0], group.dim)  # [U, D]
        pool_backward_auto(g, layout, grad_rows.numpy())
        group.update(torch.from_numpy(rows), grad_rows)
        return None, None, None, None


def pool_fused(group: DenseRows, rows: np.ndarray, layout: BagLayout, train: bool, anchor: Tensor) -> Tensor:
    """CPU path; ``rows`` [U] may hold -1 (unknown id at evaluation), which pools as zeros."""
    if train:
        return _PoolFused.apply(anchor, group, rows, layout)
    out = torch.empty(layout.batch, layout.n_features, group.dim)
    pool_forward(group.weights.numpy(), rows, layout.inverse, layout.offsets, layout.scale, layout.batch, out.numpy())
    return out


def pool_torch(group: DenseRows, rows: np.ndarray, layout: BagLayout, train: bool, anchor: Tensor) -> Tensor:
    """Device-agnostic path: index_select of unique rows, then embedding_bag."""
    dev = group.device
    r = torch.from_numpy(rows).to(dev)
    if train:
        emb = _Gather.apply(anchor, group, r)  # [U, D]
    else:
        emb = group.weights.index_select(0, r.clamp(min=0))
        emb[r < 0] = 0.0  # unknown ids read as zeros
    inv = torch.from_numpy(layout.inverse).to(dev)
    offsets = torch.from_numpy(layout.offsets).to(dev)
    weights = None
    if bool((layout.scale != 1.0).any()):
        lengths = torch.from_numpy(np.diff(layout.offsets)).to(dev)
        weights = torch.from_numpy(layout.scale).to(dev).repeat_interleave(lengths)
    pooled = F.embedding_bag(inv, emb, offsets, mode="sum", per_sample_weights=weights, include_last_offset=True)
    return pooled.view(layout.n_features, layout.batch, -1).transpose(0, 1)  # [B, F_g, D]


def pool_dense(
    group: DenseRows, rows: np.ndarray, layout: BagLayout, *, train: bool, anchor: Tensor, fused: bool = True
) -> Tensor:
    """Pooled ``[B, F_g, D]`` of a storage of whole rows: ``pool_fused`` when ``fused`` and on CPU, else
    ``pool_torch``."""
    if fused and group.device.type == "cpu":
        return pool_fused(group, rows, layout, train, anchor)
    return pool_torch(group, rows, layout, train, anchor)
