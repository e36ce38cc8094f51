"""Backends: which torch.distributed backend carries each purpose's process groups.

Ids (and the hash index) stay on the host, so their exchanges run on gloo
always; the dense gradients and the row exchanges run on NCCL when the device
is CUDA (``dist.backend = "auto"``), on gloo otherwise. ``context.init_distributed``
creates the job's groups with these backends, ``layout.Layout.build`` the mesh's.

>>> from tierec.distributed.backends import Backends
>>> Backends.resolve("auto", "cuda")
Backends(dense='nccl', ids='gloo', rows='nccl')
>>> Backends.resolve("auto", "cpu").rows, Backends.resolve("gloo", "cuda").rows
('gloo', 'gloo')
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Backends:
    """The backend of each purpose's process groups."""

    IDS = "gloo"  # (a class constant, not a field) ids never leave the host

    dense: str  # DDP's gradient buckets, metrics, barriers (the default group)
    ids: str  # the embedding id exchanges: ids and the index stay on the host
    rows: str  # rows and row gradients to and from their owners

    @staticmethod
    def resolve(backend: str, device: torch.device | str) -> Backends:
        """``dist.backend`` ("auto", "gloo", "nccl") on ``device``: "auto" is NCCL on CUDA, gloo elsewhere."""
        cuda = torch.device(device).type == "cuda"
        dense = backend if backend != "auto" else ("nccl" if cuda else "gloo")
        return Backends(dense=dense, ids=Backends.IDS, rows="nccl" if cuda and dense == "nccl" else "gloo")
