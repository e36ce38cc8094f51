"""Global batches split between ranks: rank r of W takes the r-th contiguous slice.

Slices follow ``numpy.array_split``: the first ``B % W`` ranks get one extra
sample, so a short last batch still splits. The loss of a slice is scaled so
that DDP's average over ranks is the global batch mean (``loss_scale``).

>>> import torch
>>> from tierec.batch import SparseFeatures
>>> from tierec.distributed.data import slice_bounds, slice_sparse
>>> [slice_bounds(10, 4, r) for r in range(4)]
[(0, 3), (3, 6), (6, 8), (8, 10)]
>>> sp = SparseFeatures.from_lists(["a", "b"], [[[1], [2, 3], []], [[7], [], [8]]])
>>> part = slice_sparse(sp, 1, 3)
>>> part["a"].values.tolist(), part["b"].values.tolist(), part.batch_size
([2, 3], [8], 2)
"""

from __future__ import annotations

import torch

from tierec.batch import Batch, SparseFeatures


def slice_bounds(n: int, world: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of rank ``rank``'s slice of ``n`` samples."""
    base, extra = divmod(n, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def slice_sparse(sp: SparseFeatures, lo: int, hi: int) -> SparseFeatures:
    """Samples [lo, hi) of every feature, packed feature-major again."""
    b, f = sp.batch_size, len(sp.keys)
    firsts = torch.arange(f, dtype=torch.int64) * b
    starts, ends = sp.offsets[firsts + lo].tolist(), sp.offsets[firsts + hi].tolist()
    values = torch.cat([sp.values[s:e] for s, e in zip(starts, ends)]) if f else sp.values[:0]
    lengths = (sp.offsets[1:] - sp.offsets[:-1]).view(f, b)[:, lo:hi].reshape(-1)
    offsets = torch.zeros(f * (hi - lo) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return SparseFeatures(sp.keys, values, offsets, hi - lo)


def slice_batch(batch: Batch, world: int, rank: int) -> Batch:
    """This rank's slice of a global batch."""
    if world == 1:
        return batch
    lo, hi = slice_bounds(batch.size, world, rank)
    return Batch(batch.dense[lo:hi], slice_sparse(batch.sparse, lo, hi), batch.labels[lo:hi])


def loss_scale(global_size: int, world: int) -> float:
    """Multiply a slice's summed loss by this: DDP's mean over ranks is then the global batch mean.

    The embedding backward divides its gradient by ``world`` to match, so owners
    apply exactly the single-process gradient.
    """
    return world / global_size
