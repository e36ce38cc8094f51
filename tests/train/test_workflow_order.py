"""Shuffling that streams, hash splits, validation, early stopping and checkpoints/best (issue 16)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from data_helpers import synthetic_rows, write_lines  # noqa: E402

from tierec.cli import main  # noqa: E402
from tierec.config import DataConfig, SchemaConfig, load_config  # noqa: E402
from tierec.data import open_source  # noqa: E402
from tierec.data.order import Shuffle  # noqa: E402
from tierec.train.checkpoint import load_checkpoint  # noqa: E402
from tierec.train.trainer import Trainer  # noqa: E402

TINY = ["train.batch_size=32", "train.progress=false", "embedding.dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]"]


def _rows(src) -> list[int]:
    return [int(r) for blk in src.row_blocks() for r in blk.rows]


def test_shuffle_is_a_seeded_permutation_per_epoch(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.txt", synthetic_rows(500))
    cfg = DataConfig(source=str(path), test_fraction=0)
    plain = _rows(open_source(cfg, "train", 64))
    assert plain == list(range(500))
    orders = {e: _rows(open_source(cfg, "train", 64, shuffle=Shuffle(3, e, buffer_rows=50, chunk_rows=120))) for e in (0, 1)}
    for order in orders.values():
        assert sorted(order) == plain and order != plain
    assert orders[0] != orders[1]  # a new order each epoch
    assert orders[0] == _rows(open_source(cfg, "train", 64, shuffle=Shuffle(3, 0, buffer_rows=50, chunk_rows=120)))
    # resuming at batch 3 gives the rest of the same epoch, whatever the batch size was
    assert _rows(open_source(cfg, "train", 64, start_batch=3, shuffle=Shuffle(3, 1, 50, 120))) == orders[1][192:]
    # the chunks move: rows from the file's end come early
    assert min(orders[0][:50]) > 0 or max(orders[0][:50]) > 170


def test_hash_splits_are_disjoint_stable_and_keep_a_key_together(tmp_path: Path) -> None:
    n = 3000
    rng = np.random.default_rng(0)
    users = rng.integers(0, 200, n)
    table = pa.table({"user": [f"u{u}" for u in users], "item": [f"i{i}" for i in rng.integers(0, 50, n)], "y": rng.integers(0, 2, n)})
    pacsv.write_csv(table, tmp_path / "t.csv")
    schema = SchemaConfig(label="y", categorical=["user", "item"])
    for key in ("", "user"):
        cfg = DataConfig(source=str(tmp_path / "t.csv"), schema=schema, split="hash", split_key=key, test_fraction=0.2, validation_fraction=0.1)
        parts = {s: _rows(open_source(cfg, s, 128)) for s in ("train", "validation", "test")}
        assert sorted(parts["train"] + parts["validation"] + parts["test"]) == list(range(n))  # disjoint and complete
        assert parts == {s: _rows(open_source(cfg, s, 1000)) for s in parts}  # stable
        shuffled = _rows(open_source(cfg, "train", 64, shuffle=Shuffle(1, 0, 100, 500)))
        assert sorted(shuffled) == sorted(parts["train"])
        share = len(parts["test"]) / n
        assert 0.12 < share < 0.28
        if key == "user":
            owner = {}
            for split, rows in parts.items():
                for r in rows:
                    assert owner.setdefault(users[r], split) == split  # every row of a user in one split
        else:
            assert open_source(cfg, "test", 64).num_rows == len(parts["test"])  # a row hash counts exactly


def test_tail_splits_with_validation(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.txt", synthetic_rows(100))
    cfg = DataConfig(source=str(path), test_rows=20, validation_rows=10)
    assert [_rows(open_source(cfg, s, 64)) for s in ("train", "validation", "test")] == [
        list(range(70)), list(range(70, 80)), list(range(80, 100))
    ]


def test_shuffled_training_resumes_exactly(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.txt", synthetic_rows(240))
    over = [f"data.source={str(path)!r}", "data.test_rows=80", "data.shuffle_buffer=40", "data.shuffle_chunk_rows=50", "train.epochs=2", *TINY]
    full = Trainer(load_config(None, over), tmp_path / "full").fit()
    Trainer(load_config(None, over + ["train.max_steps=7"]), tmp_path / "part").fit()  # stops inside epoch 2 (5 batches each)
    resumed = Trainer(load_config(None, over), tmp_path / "part", resume=True).fit()
    assert full["steps"] == resumed["steps"] == 10
    a, _ = load_checkpoint(tmp_path / "full" / "checkpoints")
    b, _ = load_checkpoint(tmp_path / "part" / "checkpoints")
    for k in a:
        if not k.startswith("rng."):
            assert torch.equal(a[k], b[k]), k
    unshuffled = Trainer(load_config(None, over + ["data.shuffle=false"]), tmp_path / "plain").fit()
    assert unshuffled["test_auc"] != full["test_auc"]  # the order did change


def test_best_checkpoint_is_the_max_validation_auc_and_eval_uses_it(tmp_path: Path, capsys) -> None:
    path = write_lines(tmp_path / "t.txt", synthetic_rows(600, seed=3))
    over = [f"data.source={str(path)!r}", "data.test_rows=100", "train.eval_every=2", "train.epochs=2",
            "embedding.optimizer.lr=0.5", "train.dense_lr=0.05", *TINY, "train.batch_size=64"]  # fmt: skip
    run = tmp_path / "run"
    summary = Trainer(load_config(None, over), run).fit()
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in evals if r["kind"] == "eval" and r["split"] == "validation"]
    assert len(val) >= 4 and all(r["rows"] == 60 for r in val)  # 10% of the file, carved for eval_every
    best = max(val, key=lambda r: (r["auc"], -r["step"]))
    assert summary["best_step"] == best["step"] and summary["best_validation_auc"] == best["auc"]
    _, meta = load_checkpoint(run / "checkpoints" / "best")
    assert meta["step"] == best["step"]
    assert main(["eval", str(run), "--split", "validation"]) == 0  # the run dir: checkpoints/best by default
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["auc"] == pytest.approx(best["auc"], abs=1e-9)
    assert main(["eval", str(run), "--split", "test"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["auc"] == pytest.approx(summary["test_auc"], abs=1e-9)
    if summary["best_step"] != summary["steps"]:
        assert main(["eval", str(run), "--split", "validation", "--last"]) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["auc"] == pytest.approx(val[-1]["auc"], abs=1e-9)


def test_early_stopping_stops_after_patience_evaluations(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.txt", synthetic_rows(600, seed=4))
    over = [f"data.source={str(path)!r}", "data.test_rows=100", "train.eval_every=2", "train.epochs=20",
            "train.early_stop_patience=2", "embedding.optimizer.lr=2.0", *TINY]  # fmt: skip
    summary = Trainer(load_config(None, over), tmp_path / "run").fit()
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in records if r["kind"] == "eval" and r["split"] == "validation"]
    assert summary["steps"] < 20 * 15  # stopped before the 20 epochs of 15 batches
    assert summary["steps"] == val[-1]["step"] and summary["steps"] - summary["best_step"] == 2 * 2
    assert all(r["auc"] <= summary["best_validation_auc"] for r in val)
