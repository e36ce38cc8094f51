"""In-training embedding dimension pruning (FIITED-style) with chunked rows.

Rows are stored as chunks of a few dims in one ChunkPool per table group,
behind a per-row map from chunk positions to pool chunks (PrunedGroup). During
training each chunk's importance (decayed access frequency times gradient
magnitude) is tracked in the backward; every N steps the Pruner frees the
trailing chunks of least importance so the pools meet a byte budget or a
ratio, lets pruned chunks of rows that became important grow back, and
compacts pools that are mostly free.

>>> from tierec.config import PruneConfig
>>> from tierec.embedding import EmbeddingCollection, TableConfig
>>> from tierec.prune import Pruner
>>> from tierec.storage import storage_factory
>>> cfg = PruneConfig(enabled=True, chunk=4, target_ratio=2.0)
>>> coll = EmbeddingCollection([TableConfig(name="t", dim=8, features=["f"])], ["f"],
...                            group_factory=storage_factory(prune=cfg))
>>> pruner = Pruner(coll, cfg)    # pruner.step() every cfg.every training steps
"""

from tierec.prune.chunk_pool import ChunkPool
from tierec.prune.group import PrunedGroup
from tierec.prune.pruner import Pruner, PruneStep

__all__ = ["ChunkPool", "PruneStep", "PrunedGroup", "Pruner"]
