"""Multi-process training: row-sharded embeddings, hot-row replication, data-parallel dense part.

>>> from tierec.distributed import DistContext
>>> DistContext.single().world_size
1
"""

from tierec.distributed.context import DistContext, init_distributed, launched_by_torchrun
from tierec.distributed.exchange import Traffic, owner_of
from tierec.distributed.hot import HotPolicy, HotReplica
from tierec.distributed.layout import Layout
from tierec.distributed.sharded import ShardedEmbeddingCollection

__all__ = [
    "DistContext",
    "HotPolicy",
    "HotReplica",
    "Layout",
    "ShardedEmbeddingCollection",
    "Traffic",
    "init_distributed",
    "launched_by_torchrun",
    "owner_of",
]
