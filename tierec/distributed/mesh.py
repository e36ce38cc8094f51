"""The 2-D process mesh of Hierarchical Training: groups of ranks (``shard``) and their replicas (``replica``).

W ranks form ``W // g`` groups of ``g`` consecutive ranks (``dist.group_size``).
Inside a group the tables are row-sharded over its g ranks and the dense part is
data parallel; across groups each group holds a full replica, and the ranks that
hold the same shard in every group (one per group) form a ``replica`` group that
carries the cross-group synchronisation. Rank ``r`` is shard ``r % g`` of group
``r // g``: torchrun numbers ranks node by node, so with g the processes per
node a group is one machine and only the replica groups cross machines.

``MeshShape`` (``mesh_shape.py``) is the arithmetic (no processes); ``Hierarchy.build`` creates the
process groups with ``torch.distributed.device_mesh.init_device_mesh`` plus a
second gloo group per shard group for the embedding exchanges (as ``DistContext``
keeps the exchanges off DDP's group), and ``Hierarchy.group_context()`` is the
``DistContext`` of the rank's group, on which today's sharded collection runs
unchanged.

>>> from tierec.distributed.mesh_shape import MeshShape
>>> m = MeshShape.resolve(2, world=4)   # e.g. a 2-node torchrun with dist.group_size = 2: a group per node
>>> m.replicas, m.group_size, m.replica_of(3), m.shard_of(3), m.is_flat
(2, 2, 1, 1, False)
>>> MeshShape.resolve(0, world=4).is_flat  # 0: one group of every rank, the flat run (on any number of nodes)
True
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch.distributed as dist

from tierec.distributed.context import DistContext
from tierec.distributed.mesh_shape import MeshShape

MESH_DIMS = ("replica", "shard")


@dataclass(frozen=True)
class Hierarchy:
    """This rank's place in the mesh and the process groups it talks on."""

    shape: MeshShape
    rank: int  # global rank
    mesh: object  # torch DeviceMesh of shape (replicas, group_size), dims MESH_DIMS
    shard_group: dist.ProcessGroup  # this rank's group: DDP buckets inside the group, barriers
    shard_sparse_group: dist.ProcessGroup  # this rank's group again: the embedding exchanges
    replica_group: dist.ProcessGroup  # the same shard in every group: cross-group synchronisation

    @property
    def replica(self) -> int:
        return self.shape.replica_of(self.rank)

    @property
    def shard(self) -> int:
        return self.shape.shard_of(self.rank)

    @staticmethod
    def build(ctx: DistContext, group_size: int) -> Hierarchy:
        """Create the mesh's groups; every rank of the job must call it, in the same order."""
        from torch.distributed.device_mesh import init_device_mesh

        shape = MeshShape.resolve(group_size, world=ctx.world_size)
        mesh = init_device_mesh(ctx.device.type, (shape.replicas, shape.group_size), mesh_dim_names=MESH_DIMS)
        sparse = None
        for r in range(shape.replicas):  # new_group is collective: every rank creates every group
            g = dist.new_group(shape.group_ranks(r), backend="gloo", timeout=ctx.timeout)
            if r == shape.replica_of(ctx.rank):
                sparse = g
        return Hierarchy(
            shape=shape, rank=ctx.rank, mesh=mesh, shard_group=mesh.get_group("shard"),
            shard_sparse_group=sparse, replica_group=mesh.get_group("replica"),
        )

    def group_context(self, ctx: DistContext) -> DistContext:
        """``ctx`` seen from inside this rank's group: rank = shard, world = group size."""
        return replace(ctx, rank=self.shard, world_size=self.shape.group_size,
                       dense_group=self.shard_group, sparse_group=self.shard_sparse_group)
