"""The data layer: readers, the synthetic generator, shards and the loader.

Everything a trainer needs is :func:`open_source` (batches of one split of any
source) and :class:`BackgroundLoader` (the same batches, produced ahead in a
thread). ``tierec preprocess`` is :func:`preprocess`.

>>> from tierec.config import DataConfig, SyntheticConfig
>>> from tierec.data import open_source, BackgroundLoader
>>> cfg = DataConfig(synthetic=SyntheticConfig(train_rows=10_000))
>>> src = open_source(cfg, "train", batch_size=4096)
>>> batch = next(iter(BackgroundLoader(src, depth=2)))
>>> batch.dense.shape, len(batch.sparse.keys), batch.sparse.values.shape
(torch.Size([4096, 13]), 26, torch.Size([106496]))
"""

from tierec.data.errors import DataError, MalformedRowError, MalformedRowsWarning, NoSplitError, ProblemReport
from tierec.data.loader import BackgroundLoader, prefetch
from tierec.data.planted import PlantedModel, cardinalities
from tierec.data.schema import CRITEO_CARDINALITIES, CRITEO_CATEGORICAL, CRITEO_DENSE, Schema, criteo_schema, resolve_schema
from tierec.data.preprocess import preprocess
from tierec.data.shards import Manifest, ShardSet
from tierec.data.source import BatchSource, Dataset, SplitWarning, infer_format, open_dataset, open_source
from tierec.data.synthetic import SyntheticData, planted_logits, planted_scores

__all__ = [
    "CRITEO_CARDINALITIES",
    "CRITEO_CATEGORICAL",
    "CRITEO_DENSE",
    "BackgroundLoader",
    "BatchSource",
    "Dataset",
    "DataError",
    "MalformedRowError",
    "MalformedRowsWarning",
    "Manifest",
    "NoSplitError",
    "PlantedModel",
    "ProblemReport",
    "Schema",
    "ShardSet",
    "SplitWarning",
    "SyntheticData",
    "cardinalities",
    "criteo_schema",
    "infer_format",
    "open_dataset",
    "open_source",
    "planted_logits",
    "planted_scores",
    "preprocess",
    "prefetch",
    "resolve_schema",
]
