"""Functions the distributed tests run on every spawned rank (importable by name), and their references."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import torch

from tierec.batch import SparseFeatures
from tierec.config import DistConfig, OptimizerConfig, OptimizerKind, Pooling
from tierec.distributed import DistContext, ShardedEmbeddingCollection
from tierec.distributed.data import slice_bounds, slice_sparse
from tierec.embedding import EmbeddingCollection, TableConfig

FEATURES = ("a", "b", "c", "d")
GLOBAL_BATCH = 48
STEPS = 7


def make_tables() -> list[TableConfig]:
    """Two groups: a shared table (a, b) and a mean-pooled one (c) on Adam; d on row-wise Adagrad."""
    adam = OptimizerConfig(kind=OptimizerKind.ADAM, lr=0.05)
    rowwise = OptimizerConfig(kind=OptimizerKind.ROWWISE_ADAGRAD, lr=0.1)
    return [
        TableConfig(name="ab", dim=4, features=["a", "b"], optimizer=adam),
        TableConfig(name="c", dim=4, features=["c"], optimizer=adam, pooling=Pooling.MEAN),
        TableConfig(name="d", dim=4, features=["d"], optimizer=rowwise),
    ]


def make_batches(n: int = STEPS, seed: int = 0) -> list[tuple[SparseFeatures, torch.Tensor]]:
    """Skewed multi-hot batches (a few ids take most accesses) and a fixed loss weight per sample.

    The last training batch and the evaluation batch (the last) have 3 samples,
    so at 4 ranks one rank's slice is empty.
    """
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n + 1):  # the last one is for evaluation
        size = 3 if i >= n - 1 else GLOBAL_BATCH
        ids = []
        for f in FEATURES:
            per = []
            for _ in range(size):
                k = int(rng.integers(0, 4)) if f == "c" else 1
                per.append([int(np.exp(rng.uniform(0, np.log(300)))) for _ in range(k)])
            ids.append(per)
        sp = SparseFeatures.from_lists(list(FEATURES), ids)
        weight = torch.from_numpy(rng.standard_normal((size, len(FEATURES), 4)).astype(np.float32))
        out.append((sp, weight))
    return out


def reference(batches) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One process: the state after training on the global batches, and the eval output."""
    coll = EmbeddingCollection(make_tables(), FEATURES, seed=3)
    for sp, w in batches[:-1]:
        loss = (coll(sp) * w).sum() / sp.batch_size
        loss.backward()
    coll.eval()
    with torch.no_grad():
        out = coll(batches[-1][0])
    return coll.state_dict(), out


def collection_worker(ctx: DistContext, out_dir: str, variants: list[tuple[str, dict]]) -> None:
    """Train a sharded collection on this rank's slices; save its shard and its eval output."""
    batches = make_batches()
    w = ctx.world_size
    bounds = [slice_bounds(sp.batch_size, w, ctx.rank) for sp, _ in batches]
    local = [slice_sparse(sp, lo, hi) for (sp, _), (lo, hi) in zip(batches, bounds)]
    for name, over in variants:
        coll = ShardedEmbeddingCollection.build(make_tables(), FEATURES, ctx, DistConfig(**over), seed=3)
        prepared = coll.prepare(local[0])
        for s in range(STEPS):
            upcoming = coll.prepare(local[s + 1]) if s + 1 < STEPS else None  # posted before this batch's forward
            lo, hi = bounds[s]
            loss = (coll(local[s], prepared) * batches[s][1][lo:hi]).sum() / batches[s][0].batch_size * w
            loss.backward()
            prepared = upcoming
        hot = coll.hot_rows()
        coll.eval()
        refused = _refusals(coll, local[0], local[-1])
        with torch.no_grad():
            out = coll(local[-1])
        coll.close()
        result = {"state": coll.state_dict(), "eval": out, "hot_rows": hot, "moves": coll.hot_moves(),
                  "traffic": coll.traffic.per_step(), "refused": refused}
        torch.save(result, Path(out_dir) / f"{name}-rank{ctx.rank}.pt")


def _refusals(coll: ShardedEmbeddingCollection, sparse: SparseFeatures, other: SparseFeatures) -> list[str]:
    """The errors of forwards given the handle of another batch, a handle used twice, and one posted before
    the handle last used (none is silently matched); the handle left behind is waited out by ``close``."""
    errors = []
    first, second, third = coll.prepare(sparse), coll.prepare(other), coll.prepare(sparse)
    # `first` to another batch (refused), to its own, to its own again (refused); `third`, which waits out
    # `second`; `second` after it (refused)
    calls = [(other, first), (sparse, first), (sparse, first), (sparse, third), (other, second)]
    with torch.no_grad():
        for args in calls:
            try:
                coll(*args)
            except ValueError as e:
                errors.append(str(e))
    coll.prepare(other)  # never used: close() waits it out
    return errors


def merge_shards(states: list[dict[str, torch.Tensor]]) -> dict[str, dict[int, torch.Tensor]]:
    """{table: {id: weights ++ optimizer state}} over every shard; an id in two shards is an error.

    A pruned table's row is its dims, then its prefix of weights, of each per-dim state, and its per-row state.
    """
    merged: dict[str, dict[int, torch.Tensor]] = {}
    for sd in states:
        tables = {k[: -len(".ids")] for k in sd if k.endswith(".ids")}
        for t in tables:
            rows = merged.setdefault(t, {})
            for i, v in zip(sd[f"{t}.ids"].tolist(), _row_values(sd, t)):
                assert i not in rows, f"id {i} of table {t} is in two shards"
                rows[i] = v
    return merged


def _row_values(sd: dict[str, torch.Tensor], t: str) -> list[torch.Tensor]:
    extra = sorted(k for k in sd if k.startswith(t + ".opt."))
    per_row = [sd[k].reshape(sd[k].shape[0], -1) for k in extra]
    if f"{t}.weights" in sd:
        return list(torch.cat([sd[f"{t}.weights"]] + per_row, dim=1))
    dims = sd[f"{t}.dims"].to(torch.int64)
    ends = torch.cumsum(dims, 0).tolist()
    chunked = [sd[f"{t}.chunked.weights"]] + [sd[k] for k in sorted(k for k in sd if k.startswith(t + ".chunked.opt."))]
    out = []
    for r, (d, end) in enumerate(zip(dims.tolist(), ends)):
        parts = [torch.tensor([float(d)])] + [c[end - d : end] for c in chunked] + [p[r] for p in per_row]
        out.append(torch.cat(parts))
    return out


def compare_rows(ra: dict[int, torch.Tensor], rb: dict[int, torch.Tensor], atol: float, msg: str) -> None:
    assert ra.keys() == rb.keys(), msg
    ids = sorted(ra)
    for i in ids:
        assert ra[i].shape == rb[i].shape, f"{msg}: id {i} has {ra[i][:1].tolist()} vs {rb[i][:1].tolist()} (dims)"
    if ids:
        torch.testing.assert_close(torch.cat([rb[i] for i in ids]), torch.cat([ra[i] for i in ids]), rtol=1e-4, atol=atol, msg=msg)


# ------------------------------------------------------------------ trainer

SMALL = [
    "data.synthetic.train_rows=6144",
    "data.synthetic.test_rows=2048",
    "data.synthetic.cardinality_scale=0.001",
    "train.batch_size=512",
    "train.progress=false",
    "embedding.dim=8",
    "train.precision=fp32",
    # SGD for the dense model: Adam's first steps move each weight by about lr * sign(gradient), so a gradient
    # near 0 turns the last-bit differences of another summation order (4 ranks' all-reduce) into lr-sized
    # ones (measured: 5e-3 after 12 steps with Adam, 7e-9 with SGD); the rows and the machinery are the same
    "train.dense_optimizer=sgd",
    # The same for the rows: row-wise Adagrad's first step on a row has full size whatever its gradient, so a row
    # whose gradient is near 0 turns another summation order into a step-sized difference. With the default
    # "shrink" dense scaling, 4 ranks resumed on 2 differed from one process by 4.7e-3 in a row of 0.5 (2026-11-27;
    # the scaling buffers and the dense weights at the checkpoint were equal); "standard" keeps those rows away
    # from 0 on this data, and the machinery compared is the same
    "data.dense_scaling=standard",
    # That was not enough on an AVX2 host (AMD EPYC, 2026-11-27): DeepFM's rows (their FM gradient starts at 0
    # with fm_weight) differed by 3e-2 after 8 steps, 9e-8 after 6. An initial accumulator makes a row's first
    # step proportional to its gradient, so another summation order stays a last-bit difference
    "embedding.optimizer.initial_accumulator=0.1",
]


def train_worker(ctx: DistContext, overrides: list[str], run_dir: str, resume: bool) -> None:
    """One rank of `tierec train` (what torchrun would run), started by `spawn`."""
    from tierec.config import load_config
    from tierec.train.launch import train_in_job

    train_in_job(ctx, load_config(None, overrides), Path(run_dir), resume=resume)


class StopAtStep:
    """A SIGTERM that arrives during step ``n`` (what a scheduler sends), for ``Trainer.stop``.

    The loop reads ``requested`` once after each step (all ranks of a job agree on it);
    the run then saves a checkpoint at step ``n`` and ends with ``Interrupted``.
    """

    def __init__(self, n: int) -> None:
        self.n, self.reads = n, 0

    @property
    def requested(self) -> int | None:
        self.reads += 1
        return int(signal.SIGTERM) if self.reads >= self.n else None


def interrupted_worker(ctx: DistContext, overrides: list[str], run_dir: str, stop_at: int) -> None:
    """One rank of `tierec train` that is interrupted (SIGTERM) during step ``stop_at``: it saves and stops."""
    from tierec.config import load_config
    from tierec.train.stopping import Interrupted
    from tierec.train.trainer import Trainer

    trainer = Trainer(load_config(None, overrides), Path(run_dir), ctx=ctx)
    trainer.stop = StopAtStep(stop_at)
    try:
        trainer.fit()
    except Interrupted:
        trainer.close()
        return
    raise AssertionError(f"the run was not interrupted at step {stop_at}")


def compare_runs(a_dir: Path, b_dir: Path, *, atol: float = 2e-5) -> None:
    """Two runs' final checkpoints (either kind) hold the same rows, dense weights and metrics."""
    import json

    from tierec.train.sharded_checkpoint import load_any

    a, _ = load_any(a_dir / "checkpoints")
    b, _ = load_any(b_dir / "checkpoints")
    for prefix in ("emb/", "wide/"):
        ra = merge_shards([{k[len(prefix) :]: v for k, v in a.items() if k.startswith(prefix)}])
        rb = merge_shards([{k[len(prefix) :]: v for k, v in b.items() if k.startswith(prefix)}])
        assert ra.keys() == rb.keys()
        for t in ra:
            compare_rows(ra[t], rb[t], atol, f"{prefix}{t}")
    dense = [k for k in a if k.startswith("model.")]
    assert dense and sorted(dense) == sorted(k for k in b if k.startswith("model."))
    for k in dense:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=atol, msg=k)
    sa = json.loads((a_dir / "summary.json").read_text())
    sb = json.loads((b_dir / "summary.json").read_text())
    assert sa["steps"] == sb["steps"] and sa["test_rows"] == sb["test_rows"]
    assert abs(sa["test_auc"] - sb["test_auc"]) < 1e-4
    assert abs(sa["test_logloss"] - sb["test_logloss"]) < 1e-4
    assert abs(sa["final_train_loss"] - sb["final_train_loss"]) < 1e-4
    if "prune" in sa:  # the same chunks pruned and grown back, job-wide
        for k in ("dim_hist", "pruned_chunks", "regrown_chunks", "evicted_rows", "target_bytes"):
            assert sa["prune"][k] == sb["prune"][k], (k, sa["prune"][k], sb["prune"][k])
