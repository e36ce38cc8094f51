"""Shared pieces of the store tests: small collections, skewed batches, comparisons by id."""

from __future__ import annotations

import numpy as np
import torch

from tierec.batch import SparseFeatures
from tierec.config import OptimizerConfig, OptimizerKind, Pooling
from tierec.embedding import EmbeddingCollection, TableConfig
from tierec.store import TieredGroup, TierSpec

FEATURES = ("a", "b", "c")
DIM = 8


def tables(kind: OptimizerKind = OptimizerKind.ROWWISE_ADAGRAD, dim: int = DIM) -> list[TableConfig]:
    opt = OptimizerConfig(kind=kind, lr=0.1)
    return [
        TableConfig(name="ab", dim=dim, features=["a", "b"], optimizer=opt),
        TableConfig(name="c", dim=dim, features=["c"], optimizer=opt, pooling=Pooling.MEAN),
    ]


def batches(steps: int, batch: int = 16, ids: int = 400, seed: int = 0) -> list[SparseFeatures]:
    """Multi-hot bags of Zipf-like ids (hot ids repeat across batches, a long cold tail)."""
    g = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        lists = []
        for _ in FEATURES:
            lens = g.integers(0, 4, size=batch)
            vals = (g.zipf(1.3, size=int(lens.sum())) % ids) * 7 + 1
            lists.append(np.split(vals, np.cumsum(lens)[:-1]))
        out.append(SparseFeatures.from_lists(list(FEATURES), [[list(v) for v in f] for f in lists]))
    return out


def collection(
    spec: TierSpec | None, kind: OptimizerKind = OptimizerKind.ROWWISE_ADAGRAD, seed: int = 3, dim: int = DIM
) -> EmbeddingCollection:
    factory = None
    if spec is not None:
        factory = lambda ts, sd, dev: TieredGroup(ts, spec, seed=sd, device=dev)  # noqa: E731
    return EmbeddingCollection(tables(kind, dim), FEATURES, seed=seed, group_factory=factory)


def train(coll: EmbeddingCollection, data: list[SparseFeatures], start: int = 0) -> list[torch.Tensor]:
    """One forward/backward per batch (loss: a random projection fixed by the step); returns the outputs."""
    coll.train(True)
    outs = []
    for i, sp in enumerate(data):
        out = coll(sp)
        w = torch.from_numpy(np.random.default_rng(start + i).standard_normal(tuple(out.shape)).astype(np.float32))
        (out * w).sum().backward()
        outs.append(out.detach().clone())
    return outs


def by_id(coll: EmbeddingCollection) -> dict[str, torch.Tensor]:
    """The collection's state dict with every table's rows sorted by id, store.* keys dropped."""
    sd = coll.state_dict()
    out = {}
    for t in coll.tables:
        order = torch.argsort(sd[f"{t.name}.ids"])
        for k, v in sd.items():
            if k.startswith(f"{t.name}.") and ".store." not in k:
                out[k] = v[order]
    out.update({k: v for k, v in sd.items() if k.startswith("group")})
    return out


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
