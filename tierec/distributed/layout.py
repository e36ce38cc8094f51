"""Layout: the one object that says how a job's processes are arranged, and which groups carry what.

Built once per job (``Layout.build``, a collective when the mesh has several
groups) from the job's ``DistContext`` and passed to whatever needs it
(``parallelize``, the hierarchical synchronisation, ``Job``): nothing else
computes ranks, group membership or process groups.

- ``job``: the whole job (``DistContext``): rank, W, the main rank, the device,
  the rendezvous store; its ``dense_group`` carries DDP's gradient buckets,
  metrics and barriers, its ``sparse_group`` the embedding id exchanges (and,
  on the CPU, the rows and row gradients too);
- ``shape``: the 2-D ``("replica", "shard")`` mesh (``mesh_shape.MeshShape``,
  ``dist.group_size``): W ranks as ``W // g`` groups of ``g``;
- ``group``: the same for the rank's group (rank = its shard, world = g, the
  group's own dense and sparse groups): the ranks the embeddings are sharded
  over. On a flat job (one group) it *is* ``job``;
- ``replica_group``: the ranks holding the same shard in every group (one per
  group): the cross-group synchronisation. None on a flat job.

Backends (``backends.Backends``): gloo carries the ids, which stay on the host,
always; the dense gradients and the row exchange use NCCL when the device is
CUDA (``dist.backend = "auto"``), gloo otherwise. ``init_distributed`` creates
the job's groups with these backends and ``Layout.build`` the mesh's.
Collectives go through ``wire``, which copies a tensor to its group's device
(the GPU for NCCL, the host for gloo) and the result back.

>>> from tierec.distributed.context import DistContext
>>> from tierec.distributed.layout import Layout
>>> lay = Layout.build(DistContext.single(), group_size=0)   # one process: no groups, no collective
>>> lay.is_flat, lay.group is lay.job, lay.replica, lay.shard, lay.replica_group is None
(True, True, 0, 0, True)
>>> Layout.build(DistContext.single(), group_size=2).is_flat   # one process: dist.group_size groups nothing
True
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch.distributed as dist

from tierec.distributed.backends import Backends
from tierec.distributed.context import DistContext
from tierec.distributed.mesh_shape import MeshShape

MESH_DIMS = ("replica", "shard")


@dataclass(frozen=True)
class Layout:
    """This rank's place in the job and the process groups it talks on (see the module docstring)."""

    job: DistContext  # the whole job
    shape: MeshShape  # groups of g consecutive ranks
    group: DistContext  # the rank's group (``job`` itself on a flat job)
    replica_group: dist.ProcessGroup | None = None  # the same shard in every group; None on a flat job
    mesh: object = None  # torch DeviceMesh (replicas, g) with dims MESH_DIMS; None on a flat job

    @staticmethod
    def build(job: DistContext, group_size: int) -> Layout:
        """The layout of ``job`` with groups of ``group_size`` (0: one group of every rank).

        With several groups this creates their process groups: every rank of the job must call it, in the
        same order (a collective). A flat job creates none.
        """
        # one process: nothing to group (a run resumed alone from a mesh's checkpoint keeps its dist.group_size)
        shape = MeshShape.resolve(group_size if job.is_distributed else 0, world=job.world_size)
        if shape.is_flat:
            return Layout(job=job, shape=shape, group=job)
        from torch.distributed.device_mesh import init_device_mesh

        # the mesh's groups take the job's dense backend: NCCL ("cuda") where each process has a GPU, else gloo
        mesh_device = "cuda" if dist.get_backend(job.dense_group) == "nccl" else "cpu"
        mesh = init_device_mesh(mesh_device, (shape.replicas, shape.group_size), mesh_dim_names=MESH_DIMS)
        # the group's id exchanges on gloo, and its rows on the job's row backend when that differs (NCCL on CUDA)
        rows_backend = dist.get_backend(job.rows_group) if job.rows_group is not None else None
        sparse = rows = None
        for r in range(shape.replicas):  # new_group is collective: every rank creates every group
            ranks = shape.group_ranks(r)
            g = dist.new_group(ranks, backend=Backends.IDS, timeout=job.timeout)
            rg = dist.new_group(ranks, backend=rows_backend, timeout=job.timeout) if rows_backend else None
            if r == shape.replica_of(job.rank):
                sparse, rows = g, rg
        group = replace(job, rank=shape.shard_of(job.rank), world_size=shape.group_size,
                        dense_group=mesh.get_group("shard"), sparse_group=sparse, rows_group=rows)
        return Layout(job=job, shape=shape, group=group, replica_group=mesh.get_group("replica"), mesh=mesh)

    # ------------------------------------------------------------ who this rank is

    @property
    def rank(self) -> int:  # in the job
        return self.job.rank

    @property
    def world_size(self) -> int:
        return self.job.world_size

    @property
    def is_main(self) -> bool:
        return self.job.is_main

    @property
    def is_distributed(self) -> bool:
        return self.job.is_distributed

    @property
    def is_flat(self) -> bool:  # one group: no cross-group traffic
        return self.shape.is_flat

    @property
    def replica(self) -> int:  # the rank's group
        return self.shape.replica_of(self.job.rank)

    @property
    def shard(self) -> int:  # its position inside the group
        return self.shape.shard_of(self.job.rank)

    # ------------------------------------------------------------ the group's process groups

    @property
    def shard_group(self) -> dist.ProcessGroup | None:  # DDP buckets and barriers inside the group
        return self.group.dense_group

    @property
    def shard_sparse_group(self) -> dist.ProcessGroup | None:  # the embedding exchanges inside the group
        return self.group.sparse_group

    def group_context(self, ctx: DistContext | None = None) -> DistContext:
        """The rank's group as a ``DistContext`` (``ctx``, the job's, is accepted for older callers)."""
        return self.group

    def describe(self, cross_group: str, sync_every: int, compress: str) -> str:
        """One line on how the processes are grouped ("" on one process, or a flat job on one node)."""
        ctx, shape = self.job, self.shape
        if not shape.is_flat:
            return (f"{ctx.world_size} processes as {shape.replicas} groups of {shape.group_size} "
                    f"(dist.group_size = {shape.group_size}): dist.cross_group = {cross_group}"
                    + (f" every {sync_every} steps" if cross_group == "average" else "")
                    + f", dist.compress = {compress}")
        nodes = ctx.world_size // max(ctx.local_world_size, 1)
        if ctx.is_distributed and nodes > 1 and ctx.world_size % ctx.local_world_size == 0:
            return (f"{ctx.world_size} processes on {nodes} nodes as one group; dist.group_size = "
                    f"{ctx.local_world_size} would make a group per node (docs/distributed.md)")
        return ""
