"""The shape of a 2-D process mesh (``dist.group_size``): pure arithmetic, no processes.

W ranks form ``W // g`` groups of ``g`` consecutive ranks; rank ``r`` is shard
``r % g`` of group ``r // g``. ``check_mesh`` refuses a group size that does
not divide the job before any process group exists (``context.init_distributed``
calls it); ``layout.Layout`` builds the process groups of a shape.

>>> from tierec.config import DistConfig
>>> from tierec.distributed.mesh_shape import MeshShape, check_mesh
>>> m = MeshShape.resolve(2, world=4)
>>> m.group_ranks(1), m.replica_ranks(0)
([2, 3], [0, 2])
>>> try:
...     check_mesh(DistConfig(group_size=3), 4)
... except ValueError as e:
...     print(e)
dist.group_size 3 must divide the world size 4
"""

from __future__ import annotations

from dataclasses import dataclass

from tierec.config import ConfigError, DistConfig


@dataclass(frozen=True)
class MeshShape:
    world: int  # W ranks
    group_size: int  # g ranks per group; W // g groups (replicas)

    @staticmethod
    def resolve(group_size: int, *, world: int) -> MeshShape:
        """``dist.group_size`` for a job of ``world`` ranks; 0 means one group of every rank (the flat run).

        0 stays the flat run under a multi-node torchrun too: a group per node is
        ``dist.group_size = <processes per node>`` (docs/distributed.md says why).
        """
        g = group_size or world
        if g > world or world % g:
            raise ConfigError(f"dist.group_size {g} must divide the world size {world}")
        return MeshShape(world=world, group_size=g)

    @property
    def replicas(self) -> int:
        return self.world // self.group_size

    @property
    def is_flat(self) -> bool:  # one group: today's run, no cross-group traffic
        return self.replicas == 1

    def replica_of(self, rank: int) -> int:  # the group of a rank
        return rank // self.group_size

    def shard_of(self, rank: int) -> int:  # its position inside the group
        return rank % self.group_size

    def group_ranks(self, replica: int) -> list[int]:  # ranks of one group
        return list(range(replica * self.group_size, (replica + 1) * self.group_size))

    def replica_ranks(self, shard: int) -> list[int]:  # ranks holding the same shard, one per group
        return list(range(shard, self.world, self.group_size))


def check_mesh(cfg: DistConfig, world: int) -> None:
    """Refuse a ``dist.group_size`` that does not divide the job (one line, before any process group exists)."""
    MeshShape.resolve(cfg.group_size, world=world)
