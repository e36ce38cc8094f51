"""The look-ahead (next batch's dedupe and probe on a background thread) trains exactly like the sequential path."""

from __future__ import annotations

import numpy as np
import torch

from tierec.batch import JaggedIds, SparseFeatures
from tierec.config import OptimizerConfig, OptimizerKind, Pooling
from tierec.embedding import EmbeddingCollection, TableConfig
from tierec.embedding.ahead import LookAhead

FEATURES = ["a", "b", "c", "d"]


def _collection() -> EmbeddingCollection:
    opt = OptimizerConfig(kind=OptimizerKind.ROWWISE_ADAGRAD, lr=0.05)
    adam = OptimizerConfig(kind=OptimizerKind.ADAM, lr=0.01)
    tables = [
        TableConfig(name="a", dim=8, features=["a"], optimizer=opt),
        TableConfig(name="b", dim=8, features=["b"], optimizer=opt),
        TableConfig(name="cd", dim=8, features=["c", "d"], optimizer=adam, pooling=Pooling.MEAN),  # another group, shared
    ]
    return EmbeddingCollection(tables, FEATURES, seed=3)


def _batches(n: int, b: int = 64) -> list[SparseFeatures]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        ids = {}
        for f in FEATURES:
            lengths = rng.integers(0, 3, size=b)
            # ids from a range that widens every batch: each batch brings new ids and repeats old ones
            values = torch.from_numpy(rng.integers(0, 40 + 30 * i, size=int(lengths.sum())))
            ids[f] = JaggedIds(values, torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)])))
        out.append(SparseFeatures.from_jagged(ids))
    return out


def _train(batches: list[SparseFeatures], ahead: bool) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    coll = _collection()
    g = torch.Generator().manual_seed(1)
    outs = []
    la = LookAhead(coll) if ahead else None
    for i, sp in enumerate(batches):
        out = coll(sp, la.take(sp) if la is not None else None)
        if la is not None and i + 1 < len(batches):
            la.submit(batches[i + 1])  # probes while this step's backward updates the rows
        outs.append(out.detach().clone())
        out.backward(torch.randn(out.shape, generator=g))
    if la is not None:
        la.close()
    return outs, coll.state_dict()


def test_look_ahead_equals_sequential_bitwise():
    batches = _batches(12)
    ref_out, ref_state = _train(batches, ahead=False)
    out, state = _train(batches, ahead=True)
    for a, b in zip(ref_out, out):
        assert torch.equal(a, b)
    assert ref_state.keys() == state.keys()
    for k in ref_state:
        assert torch.equal(ref_state[k], state[k]), k


def test_prepared_rows_come_from_the_probe_and_the_insert():
    coll = _collection()
    first, second = _batches(2)
    coll(first).sum().backward()
    ahead = coll.prepare(second)
    found = np.concatenate([p.found for p in ahead.parts if p.found is not None])
    assert (found >= 0).any() and (found < 0).any()  # known ids found, new ones left to forward
    rows_before = coll.num_rows()
    coll(second, ahead).sum().backward()
    assert coll.num_rows() == rows_before + int((found < 0).sum())


def test_take_of_another_batch_gives_nothing():
    coll = _collection()
    a, b = _batches(2)
    with LookAhead(coll) as la:
        la.submit(a)
        assert la.take(b) is None  # waited, but prepared for another batch
        assert la.take(a) is None  # nothing pending any more
        la.submit(a)
        assert la.take(a) is not None
