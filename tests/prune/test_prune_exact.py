"""PrunedGroup against the plain TableGroup, bit for bit.

Unpruned it must compute exactly what TableGroup computes, for every fused
optimizer. With some rows pruned it must equal a TableGroup whose pruned dims
are zeroed and frozen (gradient masked, state reset); with a chunk grown back,
a TableGroup that unfreezes those dims from zeros and fresh state.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tierec.batch import SparseFeatures
from tierec.config import OptimizerConfig, OptimizerKind, Pooling, PruneConfig
from tierec.embedding import EmbeddingCollection, TableConfig, TableGroup
from tierec.embedding.optimizers import initial_state_value
from tierec.prune import PrunedGroup

FEATURES = ("a", "b", "c")
DIM, CHUNK = 8, 2


def _tables(opt: OptimizerConfig, dim: int = DIM) -> list[TableConfig]:
    # "ab" is shared by two features (sum pooling); "c" has mean pooling; one group.
    return [
        TableConfig(name="ab", dim=dim, features=["a", "b"], optimizer=opt),
        TableConfig(name="c", dim=dim, features=["c"], optimizer=opt, pooling=Pooling.MEAN),
    ]


def _batches(steps: int, batch: int, seed: int = 0) -> list[SparseFeatures]:
    """Multi-hot bags (0..3 ids, empty bags included) over few distinct ids, so ids repeat."""
    g = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ids = [[list(g.integers(0, 12, size=g.integers(0, 4)) * 1000 + 7) for _ in range(batch)] for _ in FEATURES]
        out.append(SparseFeatures.from_lists(list(FEATURES), ids))
    return out


class _Frozen(TableGroup):
    """TableGroup whose masked dims are zero and frozen: their gradient is dropped before the update."""

    def __init__(self, tables, seed=0, device="cpu") -> None:
        super().__init__(tables, seed=seed, device=device)
        self.mask = torch.zeros(0, self.dim, dtype=torch.bool)  # [R, D] True = frozen

    def _fit(self) -> None:
        if self.mask.shape[0] < self.weights.shape[0]:
            m = torch.zeros(self.weights.shape[0], self.dim, dtype=torch.bool)
            m[: self.mask.shape[0]] = self.mask
            self.mask = m

    def freeze(self, rows: np.ndarray, dims: np.ndarray) -> None:
        self._fit()
        for r, d in zip(rows, dims):
            self.mask[r, d:] = True
            self._reset(r, d)

    def unfreeze(self, rows: np.ndarray, dims: np.ndarray) -> None:
        for r, d in zip(rows, dims):
            self.mask[r, :d] = False
            self._reset(r, d)

    def _reset(self, r: int, d: int) -> None:
        self.weights[r, d:] = 0.0
        for name, s in self.state.items():
            if s.dim() == 2:
                s[r, d:] = initial_state_value(self.optimizer, name)

    def update(self, rows, grad) -> None:
        self._fit()
        super().update(rows, grad.masked_fill(self.mask[rows], 0.0))


def _pair(
    opt: OptimizerConfig, fused: bool = True, chunk: int = CHUNK, dim: int = DIM
) -> tuple[EmbeddingCollection, EmbeddingCollection]:
    cfg = PruneConfig(chunk=chunk)
    plain = EmbeddingCollection(_tables(opt, dim), FEATURES, seed=3, group_factory=lambda ts, s, d: _Frozen(ts, s, d))
    pruned = EmbeddingCollection(_tables(opt, dim), FEATURES, seed=3, group_factory=lambda ts, s, d: PrunedGroup(ts, cfg, s, d))
    pruned.use_fused_kernels = fused
    return plain, pruned


def _step(coll: EmbeddingCollection, sp: SparseFeatures, step: int) -> torch.Tensor:
    out = coll(sp)
    target = torch.randn(out.shape, generator=torch.Generator().manual_seed(step))
    ((out - target) ** 2).sum().backward()
    return out.detach()


def _assert_same_rows(plain: EmbeddingCollection, pruned: EmbeddingCollection) -> None:
    gp, gq = plain.groups[0], pruned.groups[0]
    assert gp.num_rows == gq.num_rows
    rows = np.arange(gp.num_rows)
    assert torch.equal(gp.weights[: gp.num_rows], gq.gather(rows))
    # the optimizer state of live dims too
    live = torch.from_numpy(np.arange(gq.dim) < (gq.live_chunks() * gq.chunk)[:, None])
    for name, s in gq.chunks.state.items():
        got = torch.from_numpy(gq._gather_dense(name, rows))
        assert torch.equal(gp.state[name][: gp.num_rows][live], got[live]), name
    for name, s in gq.row_state.items():
        assert torch.equal(gp.state[name][: gp.num_rows], s[: gq.num_rows]), name


OPTS = [
    OptimizerConfig(kind=OptimizerKind.SGD, lr=0.1, weight_decay=0.01),
    OptimizerConfig(kind=OptimizerKind.ADAGRAD, lr=0.1, initial_accumulator=0.1),
    OptimizerConfig(kind=OptimizerKind.ROWWISE_ADAGRAD, lr=0.1, weight_decay=0.01),
    OptimizerConfig(kind=OptimizerKind.ADAM, lr=0.05),
]


@pytest.mark.parametrize("opt", OPTS, ids=lambda o: o.kind.value)
@pytest.mark.parametrize("chunk, dim", [(2, 8), (4, 16), (3, 9)], ids=["c2", "c4", "c3-generic"])
def test_unpruned_equals_plain_exactly(opt: OptimizerConfig, chunk: int, dim: int) -> None:
    plain, pruned = _pair(opt, chunk=chunk, dim=dim)
    for step, sp in enumerate(_batches(steps=5, batch=16)):
        assert torch.equal(_step(plain, sp, step), _step(pruned, sp, step))
    _assert_same_rows(plain, pruned)
    assert (pruned.groups[0].chunks.importance > 0).any()  # importance was tracked on the way


@pytest.mark.parametrize("opt", OPTS, ids=lambda o: o.kind.value)
def test_pruned_rows_equal_plain_with_dims_zeroed_and_frozen(opt: OptimizerConfig) -> None:
    plain, pruned = _pair(opt)
    batches = _batches(steps=9, batch=16, seed=1)
    for step, sp in enumerate(batches[:3]):
        _step(plain, sp, step), _step(pruned, sp, step)
    gp, gq = plain.groups[0], pruned.groups[0]
    rows = np.arange(0, gq.num_rows, 2)  # every other row, to 0, 2, 4 or 6 dims
    dims = (rows % 4) * CHUNK
    gq.set_row_dims(rows, dims)
    gp.freeze(rows, dims)
    for step, sp in enumerate(batches[3:6], start=3):
        assert torch.equal(_step(plain, sp, step), _step(pruned, sp, step))
    _assert_same_rows(plain, pruned)
    assert gq.chunks.num_free > 0
    # grow one chunk back on each pruned row: zeros and fresh state on both sides
    grown = dims + CHUNK
    keep = grown <= DIM
    gq.set_row_dims(rows[keep], grown[keep])
    gp.unfreeze(rows[keep], grown[keep])
    for step, sp in enumerate(batches[6:], start=6):
        assert torch.equal(_step(plain, sp, step), _step(pruned, sp, step))
    _assert_same_rows(plain, pruned)


@pytest.mark.parametrize("opt", OPTS[2:], ids=lambda o: o.kind.value)
def test_torch_path_matches_fused_path(opt: OptimizerConfig) -> None:
    _, fused = _pair(opt)
    _, slow = _pair(opt, fused=False)
    for coll in (fused, slow):
        for step, sp in enumerate(_batches(steps=2, batch=16, seed=2)):
            _step(coll, sp, step)
        g = coll.groups[0]
        g.set_row_dims(np.arange(g.num_rows), (np.arange(g.num_rows) % 5) * CHUNK)
    for step, sp in enumerate(_batches(steps=3, batch=16, seed=3)):
        torch.testing.assert_close(_step(fused, sp, step), _step(slow, sp, step), rtol=1e-6, atol=1e-6)
    rows = np.arange(fused.groups[0].num_rows)
    torch.testing.assert_close(fused.groups[0].gather(rows), slow.groups[0].gather(rows), rtol=1e-5, atol=1e-6)


def test_eval_reads_unknown_ids_and_pruned_dims_as_zeros() -> None:
    _, pruned = _pair(OPTS[0])
    sp = _batches(steps=1, batch=8)[0]
    _step(pruned, sp, 0)
    g = pruned.groups[0]
    g.set_row_dims(np.arange(g.num_rows), np.zeros(g.num_rows, dtype=np.int64))
    pruned.eval()
    with torch.no_grad():
        assert pruned(sp).abs().sum() == 0
        unknown = SparseFeatures.from_lists(list(FEATURES), [[[999_999]] * 2] * 3)
        assert pruned(unknown).abs().sum() == 0
    assert g.num_rows == g.index.num_rows  # evaluation inserted nothing
