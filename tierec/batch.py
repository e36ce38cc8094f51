"""Batches of CTR examples: dense features, jagged sparse ids, labels.

Sparse features are packed feature-major, like TorchRec's KeyedJaggedTensor:
all ids of feature 0 for every sample, then feature 1, and so on, with one
offsets vector over the ``F * B`` bags.

>>> import torch
>>> from tierec.batch import Batch, SparseFeatures
>>> sp = SparseFeatures.from_lists(["a", "b"], [[[1], [2, 3]], [[7], []]])
>>> sp["a"].values.tolist(), sp["a"].offsets.tolist()
([1, 2, 3], [0, 1, 3])
>>> b = Batch(dense=torch.zeros(2, 1), sparse=sp, labels=torch.tensor([0.0, 1.0]))
>>> b.size
2
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from tierec.device import copy_to


@dataclass(frozen=True)
class JaggedIds:
    """The ids of one feature for a batch: sample i owns values[offsets[i]:offsets[i+1]]."""

    values: Tensor  # [N] int64
    offsets: Tensor  # [B + 1] int64

    @property
    def lengths(self) -> Tensor:  # [B]
        return self.offsets[1:] - self.offsets[:-1]


@dataclass(frozen=True)
class SparseFeatures:
    """All sparse features of a batch, packed feature-major.

    ``offsets`` has ``len(keys) * batch_size + 1`` entries; bag ``f * B + i`` is
    feature ``f`` of sample ``i``.
    """

    keys: tuple[str, ...]
    values: Tensor  # [N] int64
    offsets: Tensor  # [F * B + 1] int64
    batch_size: int

    def __post_init__(self) -> None:
        expected = len(self.keys) * self.batch_size + 1
        if self.offsets.numel() != expected:
            raise ValueError(f"offsets has {self.offsets.numel()} entries, expected {expected}")

    def index(self, key: str) -> int:
        try:
            return self.keys.index(key)
        except ValueError:
            raise KeyError(f"no sparse feature {key!r}; have {list(self.keys)}") from None

    def __getitem__(self, key: str) -> JaggedIds:
        f = self.index(key)
        b = self.batch_size
        off = self.offsets[f * b : (f + 1) * b + 1]
        return JaggedIds(values=self.values[off[0] : off[-1]], offsets=off - off[0])

    def feature_span(self, f: int) -> tuple[int, int]:
        """Start and end positions of feature ``f``'s ids in ``values``."""
        b = self.batch_size
        return int(self.offsets[f * b]), int(self.offsets[(f + 1) * b])

    def to(self, device: torch.device | str) -> SparseFeatures:
        return SparseFeatures(self.keys, self.values.to(device), self.offsets.to(device), self.batch_size)

    @staticmethod
    def from_jagged(features: dict[str, JaggedIds]) -> SparseFeatures:
        """Pack per-feature jagged ids (all with the same batch size)."""
        keys = tuple(features)
        sizes = {j.offsets.numel() - 1 for j in features.values()}
        if len(sizes) != 1:
            raise ValueError(f"features disagree on batch size: {sorted(sizes)}")
        batch_size = sizes.pop()
        values = torch.cat([features[k].values for k in keys]) if keys else torch.empty(0, dtype=torch.int64)
        lengths = torch.cat([features[k].lengths for k in keys]) if keys else torch.empty(0, dtype=torch.int64)
        offsets = torch.zeros(len(keys) * batch_size + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        return SparseFeatures(keys, values.to(torch.int64), offsets, batch_size)

    @staticmethod
    def from_lists(keys: list[str], ids: list[list[list[int]]]) -> SparseFeatures:
        """Build from Python lists: ``ids[f][i]`` is the id list of feature f, sample i."""
        feats = {}
        for k, per_sample in zip(keys, ids):
            lengths = torch.tensor([len(x) for x in per_sample], dtype=torch.int64)
            offsets = torch.zeros(len(per_sample) + 1, dtype=torch.int64)
            torch.cumsum(lengths, 0, out=offsets[1:])
            values = torch.tensor([v for x in per_sample for v in x], dtype=torch.int64)
            feats[k] = JaggedIds(values, offsets)
        return SparseFeatures.from_jagged(feats)

    @staticmethod
    def one_hot(keys: tuple[str, ...], ids: Tensor) -> SparseFeatures:
        """One id per feature per sample; ``ids`` is ``[B, F]`` int64."""
        b, f = ids.shape
        values = ids.t().contiguous().reshape(-1)
        return SparseFeatures(tuple(keys), values, torch.arange(b * f + 1, dtype=torch.int64), b)


@dataclass(frozen=True)
class Batch:
    dense: Tensor  # [B, n_dense] float32
    sparse: SparseFeatures
    labels: Tensor  # [B] float32

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device | str) -> Batch:
        """Dense features and labels on ``device``; the ids stay on the host (tierec.device): the index,
        the dedupe and the tiers are host code, so ``sparse`` of a batch for a GPU model is on the host."""
        dev = torch.device(device)
        if self.dense.device == dev and self.labels.device == dev:
            return self
        return Batch(copy_to(self.dense, dev), self.sparse, copy_to(self.labels, dev))

    def pin_memory(self) -> Batch:
        """Dense features and labels in page-locked memory (what :meth:`to` copies to a GPU); ids stay as they are."""
        return Batch(self.dense.pin_memory(), self.sparse, self.labels.pin_memory())


T = TypeVar("T")


def with_next(items: Iterable[T]) -> Iterator[tuple[T, T | None]]:
    """(item, the one after it or None), drawing each item once: the look-ahead and the distributed overlap
    prepare the next batch while this one trains.

    >>> list(with_next([1, 2, 3]))
    [(1, 2), (2, 3), (3, None)]
    """
    it = iter(items)
    cur = next(it, None)
    while cur is not None:
        nxt = next(it, None)
        yield cur, nxt
        cur = nxt
