"""tierec, plain PyTorch, FBGEMM and TorchRec agree on pooled embeddings and one optimizer step.

Tiny tables, a batch with repeated ids (so dedupe matters), 2-hot bags. Peer
weights are overwritten with tierec's rows for the ids of the batch, then all
systems pool the same batch and take one update from the same upstream
gradient. FBGEMM and TorchRec parts skip when they cannot be imported.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.systems import fbgemm_tbe, per_table_inputs, tierec_collection, tierec_features, torchrec_fused_ebc, torchrec_kjt
from benchmarks.workload import Workload, make_batches, upstream_grad

W = Workload(tables=3, rows=40, dim=8, batch=16, zipf=1.1, hot=2, steps=1, lr=0.1)
TOL = {"rtol": 1e-5, "atol": 1e-6}


def _tierec_rows(coll) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Per table: (dense index [n], weights [n, D], optimizer sum or None) of tierec's resident rows."""
    sd = coll.state_dict()
    out = []
    for f in W.feature_names():
        idx = sd[f"{f}.ids"] & 0xFFFFFFFF
        out.append((idx, sd[f"{f}.weights"], sd.get(f"{f}.opt.sum")))
    return out


def _setup(kind: str):
    batch = make_batches(W)[0]
    grad = upstream_grad(W)  # [B, T, D]
    coll = tierec_collection(W, kind)
    pooled = coll(tierec_features(W, batch))  # [B, T, D]; inserts the batch's ids
    return batch, grad, coll, pooled


def _check_updated(coll, peer_weights: list[torch.Tensor], peer_sums: list[torch.Tensor] | None = None) -> None:
    for t, (idx, w, s) in enumerate(_tierec_rows(coll)):
        torch.testing.assert_close(peer_weights[t][idx], w, **TOL)
        if peer_sums is not None:
            torch.testing.assert_close(peer_sums[t][idx].reshape(s.shape), s, **TOL)


@pytest.mark.parametrize("kind, opt", [("sgd", torch.optim.SGD), ("adagrad", torch.optim.Adagrad)])
def test_tierec_matches_plain_torch(kind, opt):
    batch, grad, coll, pooled = _setup(kind)
    bags = torch.nn.ModuleList(torch.nn.EmbeddingBag(W.rows, W.dim, mode="sum", sparse=True) for _ in range(W.tables))
    with torch.no_grad():
        for bag, (idx, w, _) in zip(bags, _tierec_rows(coll)):
            bag.weight[idx] = w
    kwargs = {"lr": W.lr} if kind == "sgd" else {"lr": W.lr, "eps": W.eps}
    optim = opt(bags.parameters(), **kwargs)
    outs = [bag(v, o) for bag, (v, o) in zip(bags, per_table_inputs(W, batch))]
    torch.testing.assert_close(torch.stack(outs, 1), pooled, **TOL)
    pooled.backward(grad)
    torch.autograd.backward(outs, [grad[:, t] for t in range(W.tables)])
    optim.step()
    sums = None
    if kind == "adagrad":
        sums = [optim.state[bag.weight]["sum"] for bag in bags]
    _check_updated(coll, [bag.weight.detach() for bag in bags], sums)


def test_tierec_matches_fbgemm_rowwise_adagrad():
    pytest.importorskip("fbgemm_gpu")
    batch, grad, coll, pooled = _setup("rowwise_adagrad")
    tbe = fbgemm_tbe(W)
    with torch.no_grad():
        for weight, (idx, w, _) in zip(tbe.split_embedding_weights(), _tierec_rows(coll)):
            weight[idx] = w
    out = tbe(batch.indices, batch.offsets)  # [B, T*D]
    torch.testing.assert_close(out.view(W.batch, W.tables, W.dim), pooled, **TOL)
    pooled.backward(grad)
    out.backward(grad.reshape(W.batch, -1))
    sums = [s[0] for s in tbe.split_optimizer_states()]
    _check_updated(coll, [w.detach() for w in tbe.split_embedding_weights()], sums)


def test_tierec_matches_torchrec_fused_ebc():
    pytest.importorskip("torchrec")
    batch, grad, coll, pooled = _setup("rowwise_adagrad")
    ebc = torchrec_fused_ebc(W)
    weights = [ebc.embedding_bags[f"t_{f}"].weight for f in W.feature_names()]
    with torch.no_grad():
        for weight, (idx, w, _) in zip(weights, _tierec_rows(coll)):
            weight[idx] = w
    out = ebc(torchrec_kjt(W, batch)).values()  # [B, T*D]
    torch.testing.assert_close(out.view(W.batch, W.tables, W.dim), pooled, **TOL)
    pooled.backward(grad)
    out.backward(grad.reshape(W.batch, -1))
    _check_updated(coll, [w.detach() for w in weights])
