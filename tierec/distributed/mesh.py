"""The 2-D process mesh of Hierarchical Training: groups of ranks (``shard``) and their replicas (``replica``).

W ranks form ``W // g`` groups of ``g`` consecutive ranks (``dist.group_size``).
Inside a group the tables are row-sharded over its g ranks and the dense part is
data parallel; across groups each group holds a full replica, and the ranks that
hold the same shard in every group (one per group) form a ``replica`` group that
carries the cross-group synchronisation. Rank ``r`` is shard ``r % g`` of group
``r // g``: torchrun numbers ranks node by node, so with g the processes per
node a group is one machine and only the replica groups cross machines.

``MeshShape`` (``mesh_shape.py``) is the arithmetic (no processes);
``layout.Layout`` is the job's arrangement with its process groups, built once.
``Hierarchy`` is that same class under its former name (``Hierarchy.build(ctx, g)``,
``.group_context()``), kept for older callers.

>>> from tierec.distributed.mesh_shape import MeshShape
>>> m = MeshShape.resolve(2, world=4)   # e.g. a 2-node torchrun with dist.group_size = 2: a group per node
>>> m.replicas, m.group_size, m.replica_of(3), m.shard_of(3), m.is_flat
(2, 2, 1, 1, False)
>>> MeshShape.resolve(0, world=4).is_flat  # 0: one group of every rank, the flat run (on any number of nodes)
True
"""

from __future__ import annotations

from tierec.distributed.layout import MESH_DIMS, Layout

Hierarchy = Layout

__all__ = ["MESH_DIMS", "Hierarchy"]
