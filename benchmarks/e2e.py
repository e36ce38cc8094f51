"""END-TO-END comparison: DLRM training steps, then test AUC on a held-out set.

The dense model is the same class for every system (tierec's DLRM from
``build_model``, seeded identically; ``Workload.model``: the small default or
MLPerf's dims, benchmarks.models) trained with Adam; the tables are fp32 for
every system; only the embedding side and the dense model's precision differ:

- tierec: EmbeddingCollection, fused row-wise Adagrad, raw 64-bit keys, and
  the dense model run with tierec's defaults (``train.precision = "auto"``,
  ``train.compile = "auto"``: bf16 autocast on a CPU with native bf16);
- tierec-fp32: the same, with the dense model in fp32 like the peers (like for
  like: what the engine alone gives);
- tierec-ahead: tierec's defaults with ``train.look_ahead`` on (the next batch's
  dedupe and index probe on a background thread during this step);
- torchrec: FusedEmbeddingBagCollection over FBGEMM, fused RowWiseAdagrad;
- torch: nn.EmbeddingBag(sparse=True) per table + torch.optim.Adagrad
  (element-wise: torch has no row-wise Adagrad).

With ``Workload.optimizer == "adagrad"`` every system runs element-wise Adagrad
(tierec's fused "adagrad", TorchRec's Adagrad, torch's), so the test AUCs
compare one algorithm.

Every system sees the same batches in the same order: a short untimed warm-up,
then ``repeats`` timed chunks of ``steps`` fresh batches (a stream, no epochs).

>>> from benchmarks.e2e import run_e2e
>>> from benchmarks.workload import Workload
>>> res = run_e2e(Workload(tables=3, rows=100, dim=4, batch=16, steps=2), ["tierec", "torch"], 2, test_batches=2)
>>> [r["system"] for r in res["rows"]]
['tierec', 'torch']
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks.engine import omp_wait_note
from benchmarks.report import markdown_table
from benchmarks.synthetic import N_DENSE, CTRBatch, make_ctr_batches, tierec_data_batches
from benchmarks.systems import (
    Missing,
    PeerMissing,
    _init_uniform,
    per_table_inputs,
    tierec_collection,
    tierec_features,
    torchrec_fused_ebc,
    torchrec_kjt,
)
from benchmarks.timing import alternate, median, paired_ratio, spread
from benchmarks.workload import Workload

WARMUP_STEPS = 2
DENSE_LR = 1e-3


def auc(scores: Tensor, labels: Tensor) -> float:
    try:
        from tierec.train.metrics import auc as tierec_auc
    except ImportError:  # pragma: no cover - metrics landed before the benchmarks
        from sklearn.metrics import roc_auc_score

        return float(roc_auc_score(labels.numpy(), scores.numpy()))
    return tierec_auc(scores, labels)


def dense_model(w: Workload, seed: int) -> nn.Module:
    from benchmarks.models import model_config
    from tierec.models import build_model

    cfg, dim = model_config(w.model, w.dim)
    torch.manual_seed(seed)  # identical dense init for every system
    return build_model(cfg, n_dense=N_DENSE, n_sparse=w.tables, dim=dim)


class _Trainer:
    name = ""
    status = "ok"

    def __init__(self, w: Workload) -> None:
        self.w = w
        self.model = dense_model(w, w.seed)
        self.dense_opt = torch.optim.Adam(self.model.parameters(), lr=DENSE_LR)
        self.losses: list[float] = []

    def embed(self, b: CTRBatch) -> Tensor:  # [B, T, D]
        raise NotImplementedError

    def sparse_step(self) -> None:
        """Peers with a separate (non-fused) sparse optimizer step it here."""

    def dense(self, dense: Tensor, emb: Tensor) -> Tensor:  # [B] logits
        return self.model(dense, emb, None)

    def run(self, batches: list[CTRBatch]) -> None:
        for b in batches:
            self.step(b)

    def step(self, b: CTRBatch) -> None:
        logits = self.dense(b.dense, self.embed(b))
        loss = F.binary_cross_entropy_with_logits(logits, b.labels)
        self.dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.dense_opt.step()
        self.sparse_step()
        self.losses.append(float(loss.detach()))

    @torch.no_grad()
    def predict(self, b: CTRBatch) -> Tensor:  # [B] logits
        self.model.eval()
        try:
            return self.dense(b.dense, self.embed(b))
        finally:
            self.model.train()


class TierecTrainer(_Trainer):
    name = "tierec"
    precision = "auto"  # tierec's defaults (TrainConfig)
    compile = "auto"
    overlap = False  # train.look_ahead's default: the next batch's dedupe and probe beside this step

    def __init__(self, w: Workload) -> None:
        from tierec.embedding.ahead import LookAhead
        from tierec.train.precision import DenseStep

        super().__init__(w)
        self.coll = tierec_collection(w, kind=w.optimizer)
        self.dense_step = DenseStep(self.model, self.precision, self.compile)
        self.ahead = LookAhead(self.coll) if self.overlap else None
        self._next: CTRBatch | None = None
        self._prepared: tuple[CTRBatch, object] | None = None  # the next batch and its SparseFeatures (the one prepared)

    def run(self, batches: list[CTRBatch]) -> None:
        for i, b in enumerate(batches):
            self._next = batches[i + 1] if i + 1 < len(batches) else None
            self.step(b)
        self._next = None

    def _sparse(self, b: CTRBatch):
        prepared, self._prepared = self._prepared, None
        return prepared[1] if prepared is not None and prepared[0] is b else tierec_features(self.w, b.ids)

    def dense(self, dense: Tensor, emb: Tensor) -> Tensor:
        return self.dense_step(dense, emb, None)

    def embed(self, b: CTRBatch) -> Tensor:
        sp = self._sparse(b)
        if self.ahead is None or not self.coll.training:
            return self.coll(sp)
        out = self.coll(sp, self.ahead.take(sp))
        if self._next is not None:  # after this forward's inserts, before its dense step
            nxt = tierec_features(self.w, self._next.ids)
            self._prepared = (self._next, nxt)
            self.ahead.submit(nxt)
        return out

    @torch.no_grad()
    def predict(self, b: CTRBatch) -> Tensor:
        self.coll.eval()  # unknown ids read as zeros, nothing inserted
        try:
            return super().predict(b)
        finally:
            self.coll.train()


class TierecFp32Trainer(TierecTrainer):
    name = "tierec-fp32"
    precision = "fp32"


class TierecAheadTrainer(TierecTrainer):
    name = "tierec-ahead"
    overlap = True  # tierec's defaults with train.look_ahead = true: what the overlap hides (or costs)


class TorchrecTrainer(_Trainer):
    name = "torchrec"

    def __init__(self, w: Workload) -> None:
        super().__init__(w)
        self.ebc = torchrec_fused_ebc(w, exact_adagrad=w.optimizer == "adagrad")

    def embed(self, b: CTRBatch) -> Tensor:
        return self.ebc(torchrec_kjt(self.w, b.ids)).values().view(self.w.batch, self.w.tables, self.w.dim)


class TorchTrainer(_Trainer):
    name = "torch"

    def __init__(self, w: Workload) -> None:
        super().__init__(w)
        self.bags = nn.ModuleList(nn.EmbeddingBag(w.rows, w.dim, mode="sum", sparse=True) for _ in range(w.tables))
        with torch.no_grad():
            for t, bag in enumerate(self.bags):
                _init_uniform(bag.weight, w.dim, t)
        self.sparse_opt = torch.optim.Adagrad(self.bags.parameters(), lr=w.lr, eps=w.eps)

    def embed(self, b: CTRBatch) -> Tensor:
        return torch.stack([bag(v, o) for bag, (v, o) in zip(self.bags, per_table_inputs(self.w, b.ids))], dim=1)

    def sparse_step(self) -> None:
        self.sparse_opt.step()
        self.sparse_opt.zero_grad(set_to_none=True)


TRAINERS = {"tierec": TierecTrainer, "tierec-fp32": TierecFp32Trainer, "tierec-ahead": TierecAheadTrainer, "torchrec": TorchrecTrainer, "torch": TorchTrainer}


def run_e2e(w: Workload, systems: list[str], repeats: int, test_batches: int = 16, data: str = "planted") -> dict:
    """``data``: "planted" (benchmarks.synthetic) or "tierec" (tierec.data's synthetic generator)."""
    unknown = [s for s in systems if s not in TRAINERS]
    if unknown:
        raise ValueError(f"unknown e2e systems {unknown}; choose from {list(TRAINERS)}")
    n_train = WARMUP_STEPS + repeats * w.steps
    if data == "tierec":
        train = tierec_data_batches(w, n_train, "train")
        test = tierec_data_batches(w, test_batches, "test")
    elif data == "planted":
        train = make_ctr_batches(w, n_train, seed_offset=0)
        test = make_ctr_batches(w, test_batches, seed_offset=1)
    else:
        raise ValueError(f"unknown e2e data {data!r}; choose planted or tierec")
    built = []
    for name in systems:
        try:
            built.append(TRAINERS[name](w))
        except PeerMissing as e:
            built.append(Missing(name, str(e)))
    ready = [s for s in built if not isinstance(s, Missing)]
    for s in ready:
        for b in train[:WARMUP_STEPS]:
            s.step(b)

    def work(s, r: int) -> None:
        start = WARMUP_STEPS + r * w.steps
        s.run(train[start : start + w.steps])

    tm = alternate(ready, repeats, work)
    labels = torch.cat([b.labels for b in test])
    rows = []
    ref = None
    for s in built:
        if isinstance(s, Missing):
            rows.append({"system": s.name, "status": "missing", "error": s.error})
            continue
        scores = torch.cat([s.predict(b) for b in test])
        wall = tm.wall[s.name]
        t = median(wall)
        row = {
            "system": s.name,
            "status": "ok",
            "times_s": wall,
            "cpu_s": tm.cpu[s.name],
            "median_s": t,
            "best_s": min(wall),
            "cpu_median_s": median(tm.cpu[s.name]),
            "spread": spread(wall),
            "samples_per_s": w.steps * w.batch / t,
            "test_auc": auc(scores, labels),
            "train_loss_last_repeat": sum(s.losses[-w.steps :]) / w.steps,
            "train_steps": len(s.losses),
        }
        rows.append(row)
        if s.name == "tierec":
            ref = row
    for row in rows:
        if ref is not None and row["status"] == "ok":
            row["tierec_speedup"] = row["median_s"] / ref["median_s"]
            row["tierec_speedup_paired"] = paired_ratio(row["times_s"], ref["times_s"])
            row["tierec_speedup_cpu"] = row["cpu_median_s"] / ref["cpu_median_s"]
            row["auc_minus_tierec"] = row["test_auc"] - ref["test_auc"]
    return {
        "workload": w.as_dict(),
        "repeats": repeats,
        "data": data,
        "test_rows": int(labels.numel()),
        "test_positive_rate": float(labels.mean()),
        "dense_optimizer": f"Adam lr={DENSE_LR}",
        "loadavg_at_repeats": tm.load,
        "rows": rows,
    }


def e2e_markdown(res: dict) -> str:
    w = res["workload"]
    title = (
        f"E2E DLRM ({w.get('model', 'small')}), {w['tables']} tables x {w['rows']:,} rows, dim {w['dim']}, batch {w['batch']}, zipf {w['zipf']}, "
        f"{w['steps']} steps x {res['repeats']} repeats; test AUC on {res['test_rows']:,} held-out rows; "
        f"data: {res.get('data', 'planted')}; sparse optimizer {w.get('optimizer', 'rowwise_adagrad')}; {omp_wait_note()}"
    )
    table = []
    for r in res["rows"]:
        if r["status"] != "ok":
            table.append([r["system"], "missing", *["-"] * 7, r["error"]])
            continue
        table.append(
            [
                r["system"],
                f"{r['samples_per_s']:,.0f}",
                r["median_s"] * 1000 / w["steps"],
                r["cpu_median_s"] * 1000 / w["steps"],
                r.get("tierec_speedup", float("nan")),
                r.get("tierec_speedup_paired", float("nan")),
                r.get("tierec_speedup_cpu", float("nan")),
                f"{r['test_auc']:.4f}",
                f"{r.get('auc_minus_tierec', float('nan')):+.4f}",
                f"{r['train_loss_last_repeat']:.4f}",
            ]
        )
    hdr = [
        "system",
        "samples/s (median)",
        "ms/step",
        "CPU ms/step",
        "tierec speedup (medians)",
        "(paired)",
        "(CPU)",
        "test AUC",
        "AUC - tierec",
        "train loss (last repeat)",
    ]
    return f"**{title}**\n\n" + markdown_table(hdr, table)
