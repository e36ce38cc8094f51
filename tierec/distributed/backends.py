"""Backends: which torch.distributed backend carries each purpose's process groups.

Ids (and the hash index) stay on the host, so their exchanges run on gloo
always; the dense gradients and the row exchanges run on NCCL when the device
is CUDA and each process has a GPU of its own (``dist.backend = "auto"``), on
gloo otherwise: NCCL refuses two ranks on one GPU, so processes that share one
(``--nproc`` above the GPU count) run gloo, which takes CUDA tensors through
the host (``wire``). ``context.init_distributed`` creates the job's groups with
these backends, ``layout.Layout.build`` the mesh's.

>>> from tierec.distributed.backends import Backends
>>> Backends.resolve("auto", "cuda")
Backends(dense='nccl', ids='gloo', rows='nccl')
>>> Backends.resolve("auto", "cpu").rows, Backends.resolve("gloo", "cuda").rows
('gloo', 'gloo')
>>> Backends.resolve("auto", "cuda", shared_gpu=True).dense
'gloo'
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tierec.config import ConfigError


@dataclass(frozen=True)
class Backends:
    """The backend of each purpose's process groups."""

    IDS = "gloo"  # (a class constant, not a field) ids never leave the host

    dense: str  # DDP's gradient buckets, metrics, barriers (the default group)
    ids: str  # the embedding id exchanges: ids and the index stay on the host
    rows: str  # rows and row gradients to and from their owners

    @staticmethod
    def resolve(backend: str, device: torch.device | str, *, shared_gpu: bool = False) -> Backends:
        """``dist.backend`` ("auto", "gloo", "nccl") on ``device``: "auto" is NCCL on CUDA, gloo elsewhere and
        where processes share a GPU (``shared_gpu``; NCCL asked for there is refused in one line)."""
        cuda = torch.device(device).type == "cuda"
        if backend == "nccl" and not cuda:
            raise ConfigError('dist.backend = "nccl" needs train.device = "cuda": use "auto" or "gloo" on the CPU')
        if backend == "nccl" and shared_gpu:
            raise ConfigError('dist.backend = "nccl": NCCL needs a GPU per process and this node has fewer GPUs '
                              'than processes; use "auto" (gloo there) or fewer processes')
        dense = backend if backend != "auto" else ("nccl" if cuda and not shared_gpu else "gloo")
        return Backends(dense=dense, ids=Backends.IDS, rows="nccl" if cuda and dense == "nccl" else "gloo")
