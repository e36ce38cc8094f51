"""DistContext: who this process is in a job, and the process groups it talks on.

Nothing about the job lives in module state: ranks, groups, the rendezvous
store and the device travel in one ``DistContext`` that every distributed
object receives. ``init_distributed`` builds it from torchrun's environment
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ...; under
``tierec train --nproc N`` the launcher hosts the store, as torchrun's agent does);
``DistContext.single()`` is the one-process context, with no groups at all.

Two groups: the default one carries DDP's gradient buckets and metrics, a
second one (``sparse_group``, gloo: ids stay on the host) the embedding
all-to-alls, so that a sparse exchange issued asynchronously never has to be
ordered against DDP's buckets. On CUDA a third (``rows_group``, NCCL) is made
for the rows and row gradients (``backends.Backends``); elsewhere they share
``sparse_group``. On CUDA local rank r uses GPU ``r % torch.cuda.device_count()``.
A ``DistContext`` is one set of ranks; the job's arrangement into groups is
``layout.Layout``, built on it.

>>> from tierec.distributed.context import DistContext
>>> ctx = DistContext.single()
>>> ctx.rank, ctx.world_size, ctx.is_main, ctx.is_distributed
(0, 1, True, False)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from tierec.config import DistConfig
from tierec.distributed.backends import Backends
from tierec.distributed.mesh_shape import check_mesh
from tierec.threads import use_threads


STORE_ENV = "TIEREC_STORE"  # "launcher": the store at MASTER_ADDR:MASTER_PORT is the `--nproc N` launcher's


def launched_by_torchrun() -> bool:
    """True when the environment describes a multi-process job (torchrun sets these)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dense_group: dist.ProcessGroup | None = None  # DDP buckets, metrics, checkpoint barriers
    sparse_group: dist.ProcessGroup | None = None  # embedding id exchanges (gloo)
    rows_group: dist.ProcessGroup | None = None  # rows / row gradients when not on sparse_group (NCCL on CUDA)
    store: dist.Store | None = None  # the rendezvous store (heartbeats)
    timeout: timedelta = timedelta(seconds=300)

    @staticmethod
    def single(device: torch.device | str = "cpu") -> DistContext:
        return DistContext(device=torch.device(device))

    @property
    def is_main(self) -> bool:  # rank 0 prints progress and writes metrics
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def row_group(self) -> dist.ProcessGroup | None:  # where rows and row gradients go to and from owners
        return self.rows_group if self.rows_group is not None else self.sparse_group

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier(group=self.dense_group)

    def close(self) -> None:
        """Tear the process groups down (only after a clean finish: a broken group may hang)."""
        if self.is_distributed and dist.is_initialized():
            dist.destroy_process_group()


def _job_store(rank: int, world: int, timeout: timedelta) -> dist.Store:
    """The job's rendezvous store: the ``--nproc N`` launcher's (it outlives any rank), else env://'s."""
    if os.environ.get(STORE_ENV) == "launcher":
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        return dist.TCPStore(host, port, world, is_master=False, timeout=timeout)
    store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
    return store


def init_distributed(cfg: DistConfig, device: str = "cpu", *, threads: int = 0) -> DistContext:
    """Join the job torchrun described in the environment; one process gets ``single()``.

    ``threads`` (0 = share the cores evenly between the node's processes) sets
    torch's and numba's thread counts, so N processes do not each start one
    thread per core.
    """
    if not launched_by_torchrun():
        return DistContext.single(device)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    check_mesh(cfg, world)
    dev = torch.device(device)
    shared_gpu = False
    if dev.type == "cuda":  # a GPU per local process; where there are fewer, processes share them (gloo then)
        gpus = torch.cuda.device_count()
        shared_gpu = local_world > gpus
        dev = torch.device("cuda", local_rank % gpus)
        torch.cuda.set_device(dev)
    backends = Backends.resolve(cfg.backend, dev, shared_gpu=shared_gpu)
    timeout = timedelta(seconds=cfg.timeout_s)
    store = _job_store(rank, world, timeout)
    dist.init_process_group(backends.dense, store=store, rank=rank, world_size=world, timeout=timeout)
    # Ids stay on the host: gloo even when the dense part runs on NCCL; rows get their own group when the
    # backend differs (NCCL on CUDA), else they share the ids' group.
    sparse = dist.new_group(backend=backends.ids, timeout=timeout)
    rows = dist.new_group(backend=backends.rows, timeout=timeout) if backends.rows != backends.ids else None
    n = threads or max(1, (os.cpu_count() or 1) // local_world)
    use_threads(n)
    return DistContext(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        device=dev,
        dense_group=dist.group.WORLD,
        sparse_group=sparse,
        rows_group=rows,
        store=store,
        timeout=timeout,
    )
