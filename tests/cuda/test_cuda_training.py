"""The GPU as a placement (``train.device = "cuda"``): every storage against the CPU run of the same config.

Run where a CUDA device is (``pytest -m cuda``; skipped elsewhere). Each test
builds the same components on the CPU and on the GPU and checks that they
compute the same thing within float tolerance: pooled embeddings and updated
rows for every storage (plain rows and the tiers' fast tier in GPU memory,
pruned chunks in host memory), and whole training runs (same test AUC within
1e-4 in fp32, same rows).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tierec.batch import SparseFeatures
from tierec.config import load_config
from tierec.embedding import EmbeddingCollection, tables_from_config
from tierec.storage import storage_factory
from tierec.store.plan import StorePlan
from tierec.train.trainer import Trainer

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

FEATURES = [f"f{i}" for i in range(4)]

# storage name -> config overrides (sizes for the trainer's synthetic data; the disk tier's directory is added per test)
STORAGES = {
    "plain": [],
    "tiered": ["store.enabled=true", "store.cache_size=1MiB", "store.host_size=512KiB"],
    "tiered+prefetch": ["store.enabled=true", "store.cache_size=1MiB", "store.host_size=512KiB", "store.prefetch=true"],
    "pruned": ["prune.enabled=true", "prune.every=4", "prune.target_ratio=2", "prune.start_step=4"],
    "tiered+pruned": ["store.enabled=true", "store.cache_size=1MiB", "store.host_size=512KiB",
                      "prune.enabled=true", "prune.every=4", "prune.target_ratio=2", "prune.start_step=4"],
}
SMALL_TIERS = {"store.cache_size=1MiB": "store.cache_size=64KiB", "store.host_size=512KiB": "store.host_size=32KiB"}


def _overrides(name: str, tmp_path, small: bool = False) -> list[str]:
    extra = [SMALL_TIERS.get(o, o) if small else o for o in STORAGES[name]]
    if "store.enabled=true" in extra:
        extra.append(f"store.disk_path={tmp_path / 'disk'}")
    return extra


def _batches(n: int, batch: int = 256, seed: int = 0) -> list[SparseFeatures]:
    g = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = np.minimum(g.zipf(1.2, size=(batch, len(FEATURES))), 50_000).astype(np.int64)
        out.append(SparseFeatures.one_hot(tuple(FEATURES), torch.from_numpy(ids)))
    return out


def _collection(overrides: list[str], device: str) -> EmbeddingCollection:
    cfg = load_config(None, ["embedding.dim=16", *overrides])
    plan = StorePlan(cfg.store, [tables_from_config(cfg.embedding, FEATURES)])
    factory = storage_factory(plan, cfg.prune if cfg.prune.enabled else None)
    return EmbeddingCollection(plan.tables(tables_from_config(cfg.embedding, FEATURES)), FEATURES, seed=0,
                               device=device, group_factory=factory)


def _assert_same_rows(a: EmbeddingCollection, b: EmbeddingCollection) -> int:
    """Every row record (ids, weights, optimizer state, a pruned row's dims) equal within float tolerance;
    returns the number of rows compared."""
    ra, rb = list(a.iter_rows()), list(b.iter_rows())
    assert [t for t, _ in ra] == [t for t, _ in rb]
    rows = 0
    for (_, x), (_, y) in zip(ra, rb):
        assert x.keys() == y.keys()
        for k in x:
            if x[k].is_floating_point():
                torch.testing.assert_close(y[k], x[k], rtol=1e-4, atol=1e-5, msg=k)
            else:
                assert torch.equal(y[k], x[k]), k
        rows += x["ids"].numel()
    return rows


@pytest.mark.parametrize("name", ["plain", "tiered", "pruned", "tiered+pruned"])
def test_collection_on_the_gpu_equals_the_cpu(name, tmp_path) -> None:
    data = _batches(12)
    colls = {dev: _collection(_overrides(name, tmp_path / dev, small=True), dev) for dev in ("cpu", "cuda")}
    target = torch.randn(256, len(FEATURES), 16, generator=torch.Generator().manual_seed(1))
    for sp in data:
        outs = {}
        for dev, coll in colls.items():
            out = coll(sp)
            assert out.device.type == torch.device(dev).type
            (out * target.to(out.device)).sum().backward()  # rows updated by their fused optimizers
            outs[dev] = out.detach().cpu()
        torch.testing.assert_close(outs["cuda"], outs["cpu"], rtol=1e-4, atol=1e-5)
    assert _assert_same_rows(colls["cpu"], colls["cuda"]) > 1000
    if name == "tiered":  # the fast tier really is GPU memory, and rows really moved through the tiers
        group = colls["cuda"].groups[0]
        assert group.weights.device.type == "cuda"
        assert sum(s["evicted"] for s in group.stats().values()) > 0


def _fit(device: str, overrides: list[str], run_dir) -> dict:
    cfg = load_config(None, [
        "data.synthetic.train_rows=16384", "data.synthetic.test_rows=4096", "train.batch_size=1024",
        "train.progress=false", "train.plots=false", "train.precision=fp32", f"train.device={device}", *overrides,
    ])
    return Trainer(cfg, run_dir, echo=lambda _: None).fit()


@pytest.mark.parametrize("name", ["plain", "tiered", "tiered+prefetch", "pruned", "tiered+pruned"])
def test_training_on_the_gpu_equals_the_cpu(name, tmp_path) -> None:
    runs = {dev: _fit(dev, _overrides(name, tmp_path / dev), tmp_path / f"run-{dev}") for dev in ("cpu", "cuda")}
    assert runs["cuda"]["steps"] == runs["cpu"]["steps"] == 16
    assert abs(runs["cuda"]["test_auc"] - runs["cpu"]["test_auc"]) <= 1e-4, runs
    assert runs["cuda"]["embedding_rows"] == runs["cpu"]["embedding_rows"]


def test_a_gpu_run_resumes_from_its_checkpoint(tmp_path) -> None:
    """A GPU run stopped half way and resumed ends where an uninterrupted one does."""
    full = _fit("cuda", [], tmp_path / "full")
    _fit("cuda", ["train.max_steps=8", "train.checkpoint_every=8"], tmp_path / "half")
    cfg = load_config(None, [
        "data.synthetic.train_rows=16384", "data.synthetic.test_rows=4096", "train.batch_size=1024",
        "train.progress=false", "train.plots=false", "train.precision=fp32", "train.device=cuda",
    ])
    resumed = Trainer(cfg, tmp_path / "half", resume=True, echo=lambda _: None).fit()
    assert resumed["steps"] == full["steps"]
    assert abs(resumed["test_auc"] - full["test_auc"]) <= 1e-6
