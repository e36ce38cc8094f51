"""The single-process embedding engine: hash-indexed dynamic tables with fused sparse optimizers.

>>> from tierec.embedding import EmbeddingCollection, TableConfig, tables_from_config
"""

from tierec.embedding.collection import EmbeddingCollection
from tierec.embedding.group import TableGroup
from tierec.embedding.hash_index import HashIndex
from tierec.embedding.table import TableConfig, tables_from_config

__all__ = ["EmbeddingCollection", "HashIndex", "TableConfig", "TableGroup", "tables_from_config"]
