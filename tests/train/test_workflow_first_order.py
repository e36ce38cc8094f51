"""First-order tables of DLRM on id-only data with pruning: the dim-1 tables are never pruned, and are saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tierec.config import load_config
from tierec.data.id_only import write_id_only
from tierec.train.checkpoint import load_checkpoint
from tierec.train.components import Components
from tierec.train.trainer import Trainer


@pytest.fixture(scope="module")
def ids(tmp_path_factory) -> list[str]:
    path = tmp_path_factory.mktemp("ids") / "ids.csv"
    write_id_only(path, rows=4000, users=3000, items=80, seed=1)
    return [f"data.source={json.dumps(str(path))}", 'data.schema.label="clicked"', 'data.schema.categorical=["user","item"]',
            "train.batch_size=256", "train.progress=false", "embedding.dim=8", "model.top_mlp=[8]"]


def test_pruning_never_touches_the_first_order_tables(ids: list[str]) -> None:
    cfg = load_config(None, ids + ["prune.enabled=true", "prune.chunk=4", "prune.every=4", "prune.target_ratio=2"])
    parts = Components.build(cfg, ["user", "item"], n_dense=0)
    assert parts.wide is not None and all(g.pruning() is None for g in parts.wide.groups)
    assert parts.pruner is not None and len(parts.pruner.groups) == len(parts.embeddings.groups) > 0


@pytest.mark.parametrize("storage", ["pruned", "tiered", "tiered+pruned"])
def test_dlrm_id_only_trains_on_every_storage(ids: list[str], storage: str, tmp_path: Path) -> None:
    extra = {
        "pruned": ["prune.enabled=true", "prune.chunk=4", "prune.every=4", "prune.target_ratio=2"],
        "tiered": ["store.enabled=true", "store.memory_budget=40KiB", "store.cache_size=24KiB", f"store.disk_path={json.dumps(str(tmp_path / 'disk'))}"],
    }
    over = ids + [x for part in storage.split("+") for x in extra[part]]
    plain = Trainer(load_config(None, ids), tmp_path / "plain").fit()
    run = Trainer(load_config(None, over), tmp_path / "run").fit()
    tensors, _ = load_checkpoint(tmp_path / "run" / "checkpoints")
    wide = {k for k, v in tensors.items() if ".wide" in k and v.numel()}
    assert wide, sorted(tensors)[:20]  # the dim-1 tables are saved with the run
    if storage == "tiered":  # placement does not change the numbers
        assert run["test_auc"] == pytest.approx(plain["test_auc"], abs=1e-6)
        assert run["final_train_loss"] == pytest.approx(plain["final_train_loss"], abs=1e-6)
    assert run["test_auc"] > 0.6, run
    if storage.startswith("tiered"):  # rows really lived on disk
        assert run["store"]["rows_disk"] > 0, run["store"]


@pytest.mark.parametrize("storage", ["plain", "tiered"])
def test_first_order_weights_start_from_the_counted_rates(ids: list[str], storage: str, tmp_path: Path) -> None:
    """``model.first_order_init = "rates"``: each first-order row starts at its id's log-odds over the base rate / F,
    smoothed towards its frequency class's rate, counted here row by row in plain Python; "zeros" leaves them at 0."""
    import math

    from tierec.data import open_source
    from tierec.train.dense_stats import fit_to_training_split
    from tierec.train.first_order_rates import PRIOR_ROWS

    extra = {"plain": [], "tiered": ["store.enabled=true", "store.memory_budget=40KiB", "store.cache_size=24KiB",
                                     f"store.disk_path={json.dumps(str(tmp_path / 'disk'))}"]}[storage]
    cfg = load_config(None, ids + extra + ['model.first_order_init="rates"', "data.dense_stats_rows=1000"])  # 4 batches of 256
    source = open_source(cfg.data, "train", cfg.train.batch_size)
    parts = Components.build(cfg, source.feature_names, source.n_dense)
    fit_to_training_split(cfg, parts, source, print)
    counts: dict[tuple[str, int], list[float]] = {}
    rows = positives = 0.0
    for batch in open_source(cfg.data, "train", cfg.train.batch_size):
        if rows >= 1000:
            break
        for i, y in enumerate(batch.labels.tolist()):
            rows, positives = rows + 1, positives + y
            for f, key in enumerate(batch.sparse.keys):
                b = batch.sparse.batch_size
                lo, hi = batch.sparse.offsets[f * b + i : f * b + i + 2].tolist()
                for v in batch.sparse.values[lo:hi].tolist():
                    c = counts.setdefault((key, v), [0.0, 0.0])
                    c[0], c[1] = c[0] + 1, c[1] + y
    assert rows == 1024
    p = positives / rows
    sd = parts.wide.state_dict()
    checked = 0
    for t in parts.wide.tables:
        got = dict(zip(sd[f"{t.name}.ids"].tolist(), sd[f"{t.name}.weights"][:, 0].tolist()))
        (feature,) = t.features
        mine = {v: c for (key, v), c in counts.items() if key == feature}
        by_class: dict[int, list[float]] = {}  # frequency class floor(log2 n): [rows, positives]
        for n, pos in mine.values():
            c = by_class.setdefault(int(math.log2(n)), [0.0, 0.0])
            c[0], c[1] = c[0] + n, c[1] + pos
        q = {k: (pos + PRIOR_ROWS * p) / (n + PRIOR_ROWS) for k, (n, pos) in by_class.items()}
        want = {}
        for v, (n, pos) in mine.items():
            qv = q[int(math.log2(n))]
            want[v] = (math.log((pos + PRIOR_ROWS * qv) / (n - pos + PRIOR_ROWS * (1 - qv))) - math.log(p / (1 - p))) / 2
        assert len(q) >= 3  # ids in several frequency classes
        assert got.keys() == want.keys()
        for v, w in want.items():
            assert got[v] == pytest.approx(w, abs=1e-6)
            checked += 1
    assert checked > 100 and max(abs(w) for w in got.values()) > 0.05

    zeros = load_config(None, ids + extra + ['model.first_order_init="zeros"'])
    parts = Components.build(zeros, source.feature_names, source.n_dense)
    fit_to_training_split(zeros, parts, open_source(zeros.data, "train", zeros.train.batch_size), print)
    assert parts.wide.num_rows() == 0  # nothing set: rows appear, at 0, when training meets them


def test_counted_rates_merged_along_the_way_equal_those_merged_once(monkeypatch) -> None:
    """IdRates merges its per-batch counts when they pass _COMPACT_AT entries (memory); the result is the same."""
    import numpy as np
    import torch

    import tierec.train.first_order_rates as rates_module
    from tierec.batch import SparseFeatures

    rng = np.random.default_rng(0)
    batches = [(SparseFeatures.one_hot(("a", "b"), torch.from_numpy(rng.integers(0, 50, (64, 2)))),
                torch.from_numpy(rng.integers(0, 2, 64).astype(np.float32))) for _ in range(20)]

    def weights() -> dict:
        r = rates_module.IdRates({"t": ("a", "b"), "u": ("b",)})
        for sparse, labels in batches:
            r.add(sparse, labels)
        return r.weights(n_features=3)

    once = weights()
    monkeypatch.setattr(rates_module, "_COMPACT_AT", 100)
    along = weights()
    for t in ("t", "u"):
        np.testing.assert_array_equal(along[t][0], once[t][0])
        np.testing.assert_allclose(along[t][1], once[t][1], rtol=1e-6)
