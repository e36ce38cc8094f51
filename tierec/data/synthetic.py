"""Criteo-shaped synthetic data with a planted model, generated on the fly.

Every row is a pure function of ``(seed, split, row index)`` (counter-based
hashing, no random state), so batch k of any batch size is generated directly,
a resumed run skips ahead for free, and train and test are disjoint streams.
Nothing is materialised beyond the batch being made.

* 13 dense features ``I1..I13`` (``n_dense``): half-normal, like log1p counts.
* 26 categorical features ``C1..C26``: feature f has
  ``max(2, round(criteo_cardinality[f] * cardinality_scale))`` ids. A row draws
  ``ids_per_feature`` ranks from a power law with exponent ``zipf`` (a continuous
  Zipf, 0 = uniform), and a keyed 32-bit permutation per feature scatters the
  ranks over the id space; ids are folded like Criteo's:
  ``(f << 33) | permuted_rank``.
* The label is Bernoulli(sigmoid(planted logit)); see :mod:`tierec.data.planted`.

With the default ``zipf = 1.3``, the hottest 1% of each large feature's ids
(features with >= 10k ids at the default scale) take about 90% of its accesses.

>>> from tierec.config import SyntheticConfig
>>> data = SyntheticData(SyntheticConfig(seed=7))
>>> block, logits = data.block("train", start=1000, n=4)
>>> block.dense.shape, block.values.shape, logits.shape
((4, 13), (104,), (4,))
>>> bool((data.block("train", 1002, 2)[0].values.reshape(26, 2) == block.values.reshape(26, 4)[:, 2:]).all())
True
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from tierec.batch import Batch
from tierec.config import SyntheticConfig
from tierec.data.blocks import RowBlock
from tierec.data.planted import PlantedModel, seeded
from tierec.data.schema import CRITEO_CATEGORICAL

SPLITS = {"train": 1, "test": 2, "validation": 3}


class SyntheticData:
    """The generator for one SyntheticConfig: blocks of rows and their planted logits."""

    def __init__(self, cfg: SyntheticConfig) -> None:
        self.cfg = cfg
        self.model = PlantedModel.from_config(cfg)
        self.feature_names: tuple[str, ...] = CRITEO_CATEGORICAL
        self.dense_names: tuple[str, ...] = tuple(f"I{i}" for i in range(1, cfg.n_dense + 1))

    def num_rows(self, split: str) -> int:
        return {1: self.cfg.train_rows, 2: self.cfg.test_rows, 3: self.cfg.validation_rows}[_split_tag(split)]

    def block(self, split: str, start: int, n: int) -> tuple[RowBlock, np.ndarray]:
        """Rows ``start..start+n-1`` of ``split`` and their planted logits [n] float32."""
        k, n_feat = self.cfg.ids_per_feature, len(self.feature_names)
        dense, values, u_label = self.model.draw(seeded(self.cfg.seed, 100, _split_tag(split)), start, n)
        offsets = np.arange(0, n_feat * n * k + 1, k, dtype=np.int64)  # [F * n + 1]
        logits = self.model.logits(dense, values, offsets)  # [n]
        labels = (u_label < 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
        return RowBlock(labels, dense, values, offsets, n_feat, one_hot=k == 1), logits

    def blocks(self, split: str, start: int, block_rows: int) -> Iterator[RowBlock]:
        """Blocks of ``block_rows`` rows from row ``start`` to the end of the split."""
        total = self.num_rows(split)
        for a in range(start, total, block_rows):
            yield self.block(split, a, min(block_rows, total - a))[0]

    def ranges(self, split: str, ranges: list[tuple[int, int]]) -> Iterator[RowBlock]:
        """Rows ``a..b-1`` of ``split`` for each ``(a, b)``, in the order given."""
        for a, b in ranges:
            yield self.block(split, a, b - a)[0]


def planted_scores(cfg: SyntheticConfig, split: str, batch_index: int, batch_size: int) -> torch.Tensor:
    """Planted logits [B] of batch ``batch_index`` of ``split`` (regenerates the batch).

    >>> from tierec.config import SyntheticConfig
    >>> planted_scores(SyntheticConfig(test_rows=10), "test", 1, 8).shape
    torch.Size([2])
    """
    data = SyntheticData(cfg)
    total = data.num_rows(split)
    start = batch_index * batch_size
    if not 0 <= start < total:
        raise IndexError(f"batch {batch_index} of size {batch_size} is past the {total} rows of split {split!r}")
    return torch.from_numpy(data.block(split, start, min(batch_size, total - start))[1])


def planted_logits(model: SyntheticConfig | PlantedModel, batch: Batch) -> torch.Tensor:
    """Planted logits [B] of a batch of synthetic rows (e.g. read back from shards).

    Pass a PlantedModel (``PlantedModel.from_config(cfg)``) when scoring many batches.
    """
    if isinstance(model, SyntheticConfig):
        model = PlantedModel.from_config(model)
    sp = batch.sparse
    if len(sp.keys) != model.cards.shape[0]:
        raise ValueError(f"batch has {len(sp.keys)} sparse features, the planted model {model.cards.shape[0]}")
    dense = batch.dense.detach().cpu().numpy().astype(np.float32, copy=False)
    return torch.from_numpy(model.logits(dense, sp.values.cpu().numpy(), sp.offsets.cpu().numpy()))


def _split_tag(split: str) -> int:
    try:
        return SPLITS[split]
    except KeyError:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}") from None
