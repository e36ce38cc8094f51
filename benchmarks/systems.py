"""The embedding engines compared: one lookup + backward + row-wise-Adagrad step per call.

Each system owns its own copy of the same tables (``Workload.tables`` tables of
``rows`` x ``dim``) and receives the same pre-generated batches and the same
upstream gradient ``[B, T, D]`` on its pooled output.

============  ======================================================================
name          what it is
============  ======================================================================
tierec        EmbeddingCollection, one table per feature, ROWWISE_ADAGRAD, raw 64-bit
              keys; pre-populated by a pass over the batches (no first inserts timed)
tierec-cold   the same, but a fresh collection per repeat: every first insert is timed
torch         one nn.EmbeddingBag(sparse=True) per table + torch.optim.Adagrad
              (element-wise Adagrad: torch has no row-wise Adagrad)
fbgemm        fbgemm_gpu SplitTableBatchedEmbeddingBagsCodegen, HOST / CPU,
              EXACT_ROWWISE_ADAGRAD
torchrec      torchrec FusedEmbeddingBagCollection (FBGEMM TBE, fused RowWiseAdagrad)
floor         index_select + index_copy of only the batch's unique rows, weights and
              row-wise state: the bytes every system must at least move
============  ======================================================================

>>> from benchmarks.workload import Workload, make_batches, upstream_grad
>>> from benchmarks.systems import build
>>> w = Workload(tables=2, rows=50, dim=4, batch=8, steps=2)
>>> s = build("torch", w, make_batches(w), upstream_grad(w))
>>> s.step(0); s.status
'ok'
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from benchmarks.workload import EngineBatch, Workload

ENGINE_SYSTEMS = ("tierec", "tierec-cold", "torch", "fbgemm", "torchrec", "floor")


class PeerMissing(RuntimeError):
    """A peer system cannot run here (not installed, or its import fails)."""


@dataclass
class Missing:
    """Stands in for a system that could not be built; reported, never silently skipped."""

    name: str
    error: str
    status: str = "missing"


def resident_of(tensors: list[Tensor]) -> int:
    """Bytes of these CPU tensors' pages that are in physical memory (mincore)."""
    from tierec.embedding.arena import resident_bytes

    return sum(resident_bytes(t.detach().numpy()) for t in tensors)


def import_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def build(name: str, w: Workload, batches: list[EngineBatch], grad: Tensor):
    """A ready system, or ``Missing`` with the import error."""
    cls = {
        "tierec": TierecEngine,
        "tierec-cold": TierecColdEngine,
        "torch": TorchEngine,
        "fbgemm": FbgemmEngine,
        "torchrec": TorchrecEngine,
        "floor": FloorEngine,
    }[name]
    try:
        return cls(w, batches, grad)
    except PeerMissing as e:
        return Missing(name, str(e))


# ---------------------------------------------------------------------- tierec


def tierec_collection(w: Workload, kind: str = "rowwise_adagrad"):
    from tierec.config import EmbeddingConfig, OptimizerConfig
    from tierec.embedding import EmbeddingCollection, tables_from_config

    cfg = EmbeddingConfig(dim=w.dim, optimizer=OptimizerConfig(kind=kind, lr=w.lr, eps=w.eps))
    names = w.feature_names()
    return EmbeddingCollection(tables_from_config(cfg, names), names)


def tierec_features(w: Workload, b: EngineBatch):
    from tierec.batch import SparseFeatures

    return SparseFeatures(tuple(w.feature_names()), b.keys, b.offsets, w.batch)


class TierecEngine:
    name = "tierec"
    status = "ok"

    def __init__(self, w: Workload, batches: list[EngineBatch], grad: Tensor) -> None:
        self.w, self.grad = w, grad
        self.inputs = [tierec_features(w, b) for b in batches]
        self.coll = tierec_collection(w)
        self.warm_seconds = self._pass()  # inserts every id the timed steps will see

    def _pass(self) -> float:
        t0 = time.perf_counter()
        for i in range(len(self.inputs)):
            self.step(i)
        return time.perf_counter() - t0

    def step(self, i: int) -> None:
        self.coll(self.inputs[i]).backward(self.grad)

    def resident_rows(self) -> int:
        return self.coll.num_rows()

    def nbytes(self) -> int:  # weights + optimizer state + index, as allocated
        return self.coll.nbytes()

    def resident_bytes(self) -> int:  # the same, pages in physical memory only
        return self.coll.resident_nbytes()


class TierecColdEngine(TierecEngine):
    name = "tierec-cold"

    def __init__(self, w: Workload, batches: list[EngineBatch], grad: Tensor) -> None:
        self.w, self.grad = w, grad
        self.inputs = [tierec_features(w, b) for b in batches]
        self.coll = tierec_collection(w)
        self.step(0)  # compile the numba kernels outside the timings

    def before_repeat(self) -> None:
        self.coll = tierec_collection(self.w)


# ----------------------------------------------------------------------- torch


def _init_uniform(t: Tensor, dim: int, seed: int) -> None:
    bound = 1.0 / dim**0.5  # tierec's default init scale
    t.uniform_(-bound, bound, generator=torch.Generator().manual_seed(seed))


class TorchEngine:
    name = "torch"
    status = "ok"

    def __init__(self, w: Workload, batches: list[EngineBatch], grad: Tensor) -> None:
        self.w = w
        self.bags = nn.ModuleList(nn.EmbeddingBag(w.rows, w.dim, mode="sum", sparse=True) for _ in range(w.tables))
        with torch.no_grad():
            for t, bag in enumerate(self.bags):
                _init_uniform(bag.weight, w.dim, t)
        self.opt = torch.optim.Adagrad(self.bags.parameters(), lr=w.lr, eps=w.eps)
        self.inputs = [per_table_inputs(w, b) for b in batches]
        self.grads = [grad[:, t] for t in range(w.tables)]  # [B, D] each

    def pooled(self, i: int) -> list[Tensor]:  # T x [B, D]
        return [bag(v, o) for bag, (v, o) in zip(self.bags, self.inputs[i])]

    def step(self, i: int) -> None:
        torch.autograd.backward(self.pooled(i), self.grads)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def resident_rows(self) -> int:
        return self.w.tables * self.w.rows

    def nbytes(self) -> int:  # weights + Adagrad's dense [rows, dim] state
        return 2 * self.w.tables * self.w.rows * self.w.dim * 4

    def resident_bytes(self) -> int:
        tensors = [b.weight for b in self.bags] + [s for st in self.opt.state.values() for s in st.values() if s.dim()]
        return resident_of(tensors)


def per_table_inputs(w: Workload, b: EngineBatch) -> list[tuple[Tensor, Tensor]]:
    """(values, offsets [B]) per table, for nn.EmbeddingBag."""
    out = []
    for t in range(w.tables):
        o = b.offsets[t * w.batch : (t + 1) * w.batch + 1]
        out.append((b.indices[o[0] : o[-1]], (o[:-1] - o[0]).contiguous()))
    return out


# ---------------------------------------------------------------------- fbgemm


def fbgemm_tbe(w: Workload):
    """An FBGEMM table-batched embedding bag on the CPU with fused row-wise Adagrad."""
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception as e:  # ImportError, or a broken native library
        raise PeerMissing(import_error(e)) from None
    spec = (w.rows, w.dim, EmbeddingLocation.HOST, ComputeDevice.CPU)
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [spec] * w.tables,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=w.lr,
        eps=w.eps,
        pooling_mode=PoolingMode.SUM,
        weights_precision=SparseType.FP32,
        output_dtype=SparseType.FP32,
    )
    with torch.no_grad():
        for t, weight in enumerate(tbe.split_embedding_weights()):
            _init_uniform(weight, w.dim, t)
    return tbe


class FbgemmEngine:
    name = "fbgemm"
    status = "ok"

    def __init__(self, w: Workload, batches: list[EngineBatch], grad: Tensor) -> None:
        self.w = w
        self.tbe = fbgemm_tbe(w)
        self.batches = batches
        self.grad = grad.reshape(w.batch, w.tables * w.dim)  # TBE output is [B, T*D]

    def pooled(self, i: int) -> Tensor:  # [B, T*D]
        b = self.batches[i]
        return self.tbe(b.indices, b.offsets)

    def step(self, i: int) -> None:
        self.pooled(i).backward(self.grad)  # the update happens inside the backward

    def resident_rows(self) -> int:
        return self.w.tables * self.w.rows

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.tbe.weights_host, self.tbe.momentum1_host))

    def resident_bytes(self) -> int:
        return resident_of([self.tbe.weights_host, self.tbe.momentum1_host])


# -------------------------------------------------------------------- torchrec


def torchrec_fused_ebc(w: Workload, exact_adagrad: bool = False):
    try:
        import torchrec.optim as trec_optim
        from torchrec import EmbeddingBagConfig
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
    except Exception as e:
        raise PeerMissing(import_error(e)) from None
    bound = 1.0 / w.dim**0.5
    tables = [
        EmbeddingBagConfig(
            name=f"t_{f}",
            embedding_dim=w.dim,
            num_embeddings=w.rows,
            feature_names=[f],
            weight_init_min=-bound,
            weight_init_max=bound,
        )
        for f in w.feature_names()
    ]
    if exact_adagrad:  # FusedEmbeddingBagCollection refuses to fuse torchrec.optim.Adagrad (ValueError)
        raise PeerMissing("TorchRec's FusedEmbeddingBagCollection cannot fuse element-wise Adagrad")
    return FusedEmbeddingBagCollection(
        tables=tables,
        optimizer_type=trec_optim.RowWiseAdagrad,
        optimizer_kwargs={"lr": w.lr, "eps": w.eps},
    )


def torchrec_kjt(w: Workload, b: EngineBatch):
    from torchrec import KeyedJaggedTensor

    return KeyedJaggedTensor(keys=w.feature_names(), values=b.indices, offsets=b.offsets)


class TorchrecEngine:
    name = "torchrec"
    status = "ok"

    def __init__(self, w: Workload, batches: list[EngineBatch], grad: Tensor) -> None:
        self.w = w
        self.ebc = torchrec_fused_ebc(w)
        self.inputs = [torchrec_kjt(w, b) for b in batches]
        self.grad = grad.reshape(w.batch, w.tables * w.dim)

    def step(self, i: int) -> None:
        self.ebc(self.inputs[i]).values().backward(self.grad)

    def resident_rows(self) -> int:
        return self.w.tables * self.w.rows

    def nbytes(self) -> int:
        tbe = self.ebc._emb_modules[0]._emb_module
        return sum(t.numel() * t.element_size() for t in (tbe.weights_host, tbe.momentum1_host))

    def resident_bytes(self) -> int:
        tbe = self.ebc._emb_modules[0]._emb_module
        return resident_of([tbe.weights_host, tbe.momentum1_host])


# ----------------------------------------------------------------------- floor


@dataclass
class FloorEngine:
    """Gather and write back only the unique rows (weights + one float of state each)."""

    w: Workload
    batches: list[EngineBatch]
    grad: Tensor
    name: str = "floor"
    status: str = "ok"
    weights: Tensor = field(init=False)  # [T*rows, D]
    state: Tensor = field(init=False)  # [T*rows]

    def __post_init__(self) -> None:
        n = self.w.tables * self.w.rows
        self.weights = torch.empty(n, self.w.dim)
        _init_uniform(self.weights, self.w.dim, 0)
        self.state = torch.zeros(n)

    def step(self, i: int) -> None:
        u = self.batches[i].unique_rows
        self.weights.index_copy_(0, u, self.weights.index_select(0, u))
        self.state.index_copy_(0, u, self.state.index_select(0, u))

    def resident_rows(self) -> int:
        return self.w.tables * self.w.rows

    def nbytes(self) -> int:
        return (self.weights.numel() + self.state.numel()) * 4


def estimated_bytes(name: str, w: Workload) -> int:
    """Memory a system will hold, to group systems that fit together (tierec: resident rows only)."""
    full = w.tables * w.rows
    per_row = {"torch": 2 * w.dim * 4, "fbgemm": (w.dim + 1) * 4, "torchrec": (w.dim + 1) * 4, "floor": (w.dim + 1) * 4}
    if name in per_row:
        return full * per_row[name]
    touched = min(full, w.steps * w.ids_per_batch())
    return int(touched * ((w.dim + 1) * 4 * 1.6 + 24))


def touched_rows(batches: list[EngineBatch]) -> int:
    return int(np.unique(np.concatenate([b.unique_rows.numpy() for b in batches])).size)
