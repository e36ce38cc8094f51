"""The device seam: ids stay on the host; dense values, rows and pooled embeddings go to the model's device.

The index, the dedupe and the tiers' bookkeeping are host code by design, so a
batch's ids never leave the host. What crosses to the model's device (a GPU)
are tensors of values: a batch's dense features and labels, and the pooled
embeddings of a storage whose rows live in host memory (pruned chunks). They
cross through pinned (page-locked) host memory with non-blocking copies, so
the copy overlaps whatever the host does next; the gradient of a pooled
output comes back to the host the same way round. On one device (all CPU)
every function here is the identity.

>>> import torch
>>> from tierec.device import to_device
>>> x = torch.ones(2, requires_grad=True)
>>> to_device(x, torch.device("cpu")) is x
True
"""

from __future__ import annotations

import torch
from torch import Tensor


def is_host(device: torch.device | str) -> bool:
    """Whether ``device`` is host memory (the CPU); a batch for any other device is pinned and copied."""
    return torch.device(device).type == "cpu"


def resolve_device(device: torch.device | str) -> torch.device:
    """``device`` with its index: a bare "cuda" is the current CUDA device ("cuda:0"), as tensors report it."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return dev


def _pinned(x: Tensor) -> Tensor:
    """``x`` in page-locked memory (a copy unless it is pinned already); only where a GPU is present."""
    if x.is_pinned() or not torch.cuda.is_available():
        return x
    return x.pin_memory()


def copy_to(x: Tensor, device: torch.device) -> Tensor:
    """``x`` (no gradient) on ``device``: host to GPU through pinned memory without blocking the host."""
    if x.device == device:
        return x
    if is_host(x.device) and not is_host(device):
        return _pinned(x).to(device, non_blocking=True)
    return x.to(device)


class _ToDevice(torch.autograd.Function):
    """A differentiable move between devices: the forward copies values over, the backward the gradient back."""

    @staticmethod
    def forward(ctx, x: Tensor, device: torch.device) -> Tensor:
        ctx.source = x.device
        return copy_to(x, device)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad.to(ctx.source), None


def to_device(x: Tensor, device: torch.device) -> Tensor:
    """``x`` on ``device``; the gradient flows back to ``x``'s device (pooled rows of a host storage)."""
    if x.device == device:
        return x
    if not x.requires_grad:
        return copy_to(x, device)
    return _ToDevice.apply(x, device)


def storage_device(model_device: torch.device | str, *, device_rows: bool) -> torch.device:
    """Where a storage keeps its rows: the model's device when the storage can use it (``device_rows``:
    whole rows, plain or in the tiers' fast tier), else the host (chunked rows of pruning)."""
    dev = torch.device(model_device)
    return dev if device_rows else torch.device("cpu")
