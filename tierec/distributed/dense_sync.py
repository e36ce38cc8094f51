"""The dense part across groups: a DDP communication hook (``gradients``) and a parameter averager (``average``).

``gradients`` mode: DDP runs over the whole job with ``hierarchical_hook``,
which all-reduces each gradient bucket in three stages so that only 1/g of it
crosses groups per rank, compressed by ``dist.compress`` with error feedback:

1. all-reduce the bucket inside the group (uncompressed: the fast link);
2. shard s of the group sums the s-th 1/g of the bucket across groups
   (``cross.replica_sum_dense`` on the replica group, the slow link);
3. all-gather the g summed parts inside the group; divide by W.

Uncompressed, this equals DDP's all-reduce average within float tolerance.

``average`` mode: DDP runs inside each group only; every ``dist.sync_every``
steps ``DenseAverager.sync`` averages the parameters across groups. It sends
the change since the last sync (compressed, error feedback) and sets every
replica to ``anchor + mean(changes)``, so the replicas end bit-identical.

>>> import torch
>>> from tierec.distributed.codecs import codec
>>> from tierec.distributed.dense_sync import DenseAverager
>>> p = torch.nn.Parameter(torch.ones(3))
>>> avg = DenseAverager([p], codec("none"), None)
>>> with torch.no_grad():
...     _ = p.add_(1.0)
>>> avg.sync(); p.tolist()   # one replica: its own average
[2.0, 2.0, 2.0]
"""

import inspect
import time  # no `from __future__ import annotations`: DDP checks the hook's annotations at runtime
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from tierec.distributed.codecs import Codec, DenseResiduals
from tierec.distributed.cross import replica_sum_dense
from tierec.distributed.exchange import Traffic
from tierec.distributed.layout import Layout
from tierec.distributed import wire


def dense_ddp(model: nn.Module, group, device_ids: list[int] | None = None) -> DistributedDataParallel:
    """DDP over ``group`` that does not broadcast buffers before each forward (the dense parts keep none that change).

    torch 2.13 names that ``forward_sync_buffers=False`` and warns on the older
    ``broadcast_buffers=False``; earlier releases (CUDA builds such as 2.11) know
    only the older name. Either way the buffers are synced once, at construction.
    """
    known = inspect.signature(DistributedDataParallel.__init__).parameters
    off = {"forward_sync_buffers": False} if "forward_sync_buffers" in known else {"broadcast_buffers": False}
    return DistributedDataParallel(model, device_ids=device_ids, process_group=group, **off)


@dataclass
class HookState:
    """What ``hierarchical_hook`` needs: the mesh's groups, the codec, residuals and a traffic counter."""

    hier: Layout  # the job's layout on a mesh of several groups
    codec: Codec
    residuals: DenseResiduals = field(default_factory=DenseResiduals)
    traffic: Traffic = field(default_factory=Traffic)


def hierarchical_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """DDP communication hook: the bucket's average over the job, summed inside groups first."""
    buf = bucket.buffer()
    h, traffic = state.hier, state.traffic
    g, s, n = h.shape.group_size, h.shard, buf.numel()
    t0 = time.perf_counter()
    if g > 1:  # 1. inside the group
        wire.all_reduce(buf, h.shard_group)
        traffic.add("dense", 2 * (g - 1) * n * 4 // g, time.perf_counter() - t0)
    size = -(-n // g)
    mine = buf[s * size : (s + 1) * size]
    part = replica_sum_dense(mine, state.codec, state.residuals, (bucket.index(), s), h.replica_group, traffic)  # 2.
    t0 = time.perf_counter()
    if g > 1:  # 3. the parts back inside the group
        padded = torch.zeros(size, dtype=buf.dtype, device=buf.device)
        padded[: part.numel()] = part
        every = torch.empty(g * size, dtype=buf.dtype, device=buf.device)
        buf.copy_(wire.all_gather_single(every, padded, h.shard_group)[:n])
        traffic.add("dense", (g - 1) * size * 4, time.perf_counter() - t0)
    else:
        buf.copy_(part)
    buf.div_(h.shape.world)
    fut: torch.futures.Future[Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


class DenseAverager:
    """Averages parameters across the replica group: ``anchor + mean over replicas of (param - anchor)``."""

    def __init__(self, params: list[Tensor], c: Codec, group: dist.ProcessGroup | None,
                 traffic: Traffic | None = None) -> None:
        self.params = list(params)
        self.codec = c
        self.group = group
        self.traffic = traffic
        self.residuals = DenseResiduals()
        if group is not None:  # every replica starts from replica 0's parameters
            for p in self.params:
                wire.broadcast(p.data, dist.get_global_rank(group, 0), group)
        self.anchor = self._flat()  # [n] the parameters at the last sync, the same on every replica

    def _flat(self) -> Tensor:
        # on the host, where the codecs and their residuals are (the parameters may be on a GPU)
        return torch.cat([p.detach().reshape(-1).float().cpu() for p in self.params]) if self.params else torch.zeros(0)

    def reanchor(self) -> None:
        """The parameters as they are now are the last synced ones (after a checkpoint is loaded on every replica)."""
        self.anchor = self._flat()

    def sync(self) -> None:
        r = 1 if self.group is None else dist.get_world_size(self.group)
        delta = self._flat() - self.anchor
        total = replica_sum_dense(delta, self.codec, self.residuals, "params", self.group, self.traffic, "dense")
        new = self.anchor + total / r
        at = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(new[at : at + p.numel()].view_as(p))
                at += p.numel()
        self.anchor = new
