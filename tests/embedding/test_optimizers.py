"""The fused embedding engine against plain torch references, several steps, repeated ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tierec.batch import SparseFeatures
from tierec.config import OptimizerConfig, OptimizerKind, Pooling
from tierec.embedding import EmbeddingCollection, TableConfig

FEATURES = ("a", "b", "c")
DIM = 8


def _tables(opt: OptimizerConfig) -> list[TableConfig]:
    # "ab" is shared by two features (sum pooling); "c" has mean pooling.
    return [
        TableConfig(name="ab", dim=DIM, features=["a", "b"], optimizer=opt),
        TableConfig(name="c", dim=DIM, features=["c"], optimizer=opt, pooling=Pooling.MEAN),
    ]


def _batches(steps: int, batch: int, seed: int = 0) -> list[SparseFeatures]:
    """Multi-hot bags (0..3 ids, empty bags included) over few distinct ids, so ids repeat."""
    g = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ids = [[list(g.integers(0, 12, size=g.integers(0, 4)) * 1000 + 7) for _ in range(batch)] for _ in FEATURES]
        out.append(SparseFeatures.from_lists(list(FEATURES), ids))
    return out


class _Reference(nn.Module):
    """nn.EmbeddingBag per table over a dense re-numbering of the ids."""

    def __init__(self, coll: EmbeddingCollection) -> None:
        super().__init__()
        sd = coll.state_dict()
        self.maps: dict[str, dict[int, int]] = {}
        self.bags = nn.ModuleDict()
        for t in coll.tables:
            ids = sd[f"{t.name}.ids"].tolist()
            self.maps[t.name] = {v: i for i, v in enumerate(ids)}
            bag = nn.EmbeddingBag(len(ids), DIM, mode=t.pooling.value, sparse=True)
            bag.weight.data.copy_(sd[f"{t.name}.weights"])
            self.bags[t.name] = bag
        self.owner = {f: t.name for t in coll.tables for f in t.features}

    def forward(self, sp: SparseFeatures) -> torch.Tensor:  # [B, F, D]
        outs = []
        for f in FEATURES:
            j = sp[f]
            name = self.owner[f]
            idx = torch.tensor([self.maps[name][int(v)] for v in j.values], dtype=torch.int64)
            outs.append(self.bags[name](idx, j.offsets[:-1]))
        return torch.stack(outs, dim=1)

    def weights_by_id(self) -> dict[str, dict[int, torch.Tensor]]:
        return {n: {i: self.bags[n].weight[r].detach() for i, r in m.items()} for n, m in self.maps.items()}


def _rowwise_adagrad_step(ref: _Reference, lr: float, eps: float, state: dict[str, torch.Tensor]) -> None:
    """Written-out row-wise Adagrad: one accumulator per row, mean of the squared gradient."""
    for name, bag in ref.bags.items():
        g = bag.weight.grad.coalesce()
        rows, vals = g.indices()[0], g.values()
        s = state.setdefault(name, torch.zeros(bag.weight.shape[0]))
        s[rows] += (vals * vals).mean(1)
        with torch.no_grad():
            bag.weight[rows] -= lr * vals / (s[rows].sqrt() + eps).unsqueeze(1)
        bag.weight.grad = None


def _torch_optimizer(kind: OptimizerKind, params, cfg: OptimizerConfig):
    if kind is OptimizerKind.SGD:
        return torch.optim.SGD(params, lr=cfg.lr)
    if kind is OptimizerKind.ADAGRAD:
        return torch.optim.Adagrad(params, lr=cfg.lr, eps=cfg.eps)
    if kind is OptimizerKind.ADAM:
        return torch.optim.SparseAdam(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    return None


@pytest.mark.parametrize("kind", list(OptimizerKind))
@pytest.mark.parametrize("fused", [True, False], ids=["numba", "torch"])
def test_matches_torch_reference(kind: OptimizerKind, fused: bool) -> None:
    torch.manual_seed(0)
    cfg = OptimizerConfig(kind=kind, lr=0.1, eps=1e-8)
    coll = EmbeddingCollection(_tables(cfg), FEATURES, seed=3)
    coll.use_fused_kernels = fused
    batches = _batches(steps=6, batch=16)
    with torch.no_grad():  # insert every id once, without training, so the reference can copy them
        for sp in batches:
            coll(sp)
    ref = _Reference(coll)
    opt = _torch_optimizer(kind, ref.parameters(), cfg)
    rw_state: dict[str, torch.Tensor] = {}
    for step, sp in enumerate(batches):
        target = torch.randn(sp.batch_size, len(FEATURES), DIM, generator=torch.Generator().manual_seed(step))
        out, expect = coll(sp), ref(sp)
        torch.testing.assert_close(out, expect, rtol=1e-4, atol=1e-5)
        ((out - target) ** 2).sum().backward()
        ((expect - target) ** 2).sum().backward()
        if opt is None:
            _rowwise_adagrad_step(ref, cfg.lr, cfg.eps, rw_state)
        else:
            opt.step()
            opt.zero_grad()
    sd = coll.state_dict()
    want = ref.weights_by_id()
    for t in coll.tables:
        got = dict(zip(sd[f"{t.name}.ids"].tolist(), sd[f"{t.name}.weights"]))
        assert got.keys() == want[t.name].keys()
        w_got = torch.stack([got[i] for i in sorted(got)])
        w_ref = torch.stack([want[t.name][i] for i in sorted(got)])
        rel = (w_got - w_ref).norm() / w_ref.norm()
        assert rel < 1e-5, f"{kind} {t.name}: relative difference {rel:.2e}"
        # training moved the rows: the comparison is not vacuous
        assert (w_got - _initial(coll, t, sorted(got))).abs().max() > 1e-3


def _initial(coll: EmbeddingCollection, table: TableConfig, ids: list[int]) -> torch.Tensor:
    fresh = EmbeddingCollection(coll.tables, coll.feature_names, seed=3)
    g = fresh.groups[0]
    ti = g.tables.index(table)
    rows = g.lookup(np.array(ids, dtype=np.int64), np.full(len(ids), ti, dtype=np.int32), insert=True)
    return g.weights.index_select(0, rows)


def test_fused_and_torch_paths_agree_on_mixed_pooling() -> None:
    cfg = OptimizerConfig(kind=OptimizerKind.ADAM, lr=0.05)
    a = EmbeddingCollection(_tables(cfg), FEATURES, seed=1)
    b = EmbeddingCollection(_tables(cfg), FEATURES, seed=1)
    b.use_fused_kernels = False
    for step, sp in enumerate(_batches(steps=4, batch=32, seed=5)):
        oa, ob = a(sp), b(sp)
        torch.testing.assert_close(oa, ob, rtol=1e-6, atol=1e-6)
        w = torch.randn_like(oa, generator=torch.Generator().manual_seed(step))
        (oa * w).sum().backward()
        (ob * w).sum().backward()
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=1e-5, atol=1e-6)
