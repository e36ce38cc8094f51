"""Shards: reading them back gives exactly the source's batches; the manifest; the directory rules."""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from data_helpers import CRITEO_HEAD, assert_same_batches, needs_criteo, synthetic_rows, write_lines

from tierec.config import DataConfig, SchemaConfig, SyntheticConfig
from tierec.data import DataError, MalformedRowsWarning, ShardSet, open_source, preprocess


def both(cfg: DataConfig, shards: Path, split: str, batch_size: int, start_batch: int = 0) -> tuple[list, list]:
    a = list(open_source(cfg, split, batch_size, start_batch=start_batch))
    b = list(open_source(DataConfig(source=str(shards)), split, batch_size, start_batch=start_batch))
    return a, b


def test_criteo_file_round_trip_with_malformed_rows(tmp_path: Path) -> None:
    lines = synthetic_rows(500)
    lines[10] = "1\t2\t3"
    path = write_lines(tmp_path / "train.txt", lines)
    cfg = DataConfig(source=str(path), test_rows=120)
    with pytest.warns(MalformedRowsWarning):
        manifest = preprocess(cfg, tmp_path / "shards", rows_per_shard=100, progress=False)
    assert manifest.splits["train"].rows == 379 and manifest.splits["test"].rows == 120
    assert [s.rows for s in manifest.splits["train"].shards] == [100, 100, 100, 79]
    on_disk = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert on_disk["feature_names"] == [f"C{i}" for i in range(1, 27)] and on_disk["n_dense"] == 13
    assert on_disk["total_rows"] == 499 and on_disk["rows_per_shard"] == 100
    assert on_disk["source"]["format"] == "criteo"
    assert on_disk["splits"]["train"]["problems"]["malformed"] == 1
    assert on_disk["splits"]["train"]["problems"]["examples"][0][0] == 11
    for split in ("train", "test"):
        for bs, start in ((64, 0), (64, 3), (1000, 0), (37, 2)):
            with pytest.warns(MalformedRowsWarning) if split == "train" else _no_warning():  # test rows are clean
                a, b = both(cfg, tmp_path / "shards", split, bs, start)
            assert_same_batches(a, b)
    src = open_source(DataConfig(source=str(tmp_path / "shards")), "train", 64)
    assert src.num_rows == 379 and src.problems is not None and src.problems.malformed == 1
    every = open_source(DataConfig(source=str(tmp_path / "shards")), "all", 100, start_batch=2)
    assert every.num_rows == 499 and every.problems.malformed == 1
    with pytest.warns(MalformedRowsWarning):
        assert_same_batches(list(every), list(open_source(cfg, "all", 100, start_batch=2)))


@needs_criteo
def test_real_criteo_round_trip(tmp_path: Path) -> None:
    cfg = DataConfig(source=str(CRITEO_HEAD), test_rows=2000)
    preprocess(cfg, tmp_path / "s", rows_per_shard=3000, progress=False)
    for split in ("train", "test"):
        assert_same_batches(*both(cfg, tmp_path / "s", split, 2048))


def test_synthetic_multi_hot_round_trip(tmp_path: Path) -> None:
    cfg = DataConfig(synthetic=SyntheticConfig(train_rows=9000, test_rows=1500, ids_per_feature=2, n_dense=4))
    m = preprocess(cfg, tmp_path / "s", rows_per_shard=4000, progress=False)
    assert m.multi_hot == m.feature_names and len(m.dense_names) == 4
    for split in ("train", "test"):
        assert_same_batches(*both(cfg, tmp_path / "s", split, 1024, start_batch=1))


def test_no_dense_features_round_trip(tmp_path: Path) -> None:
    cfg = DataConfig(synthetic=SyntheticConfig(train_rows=1000, test_rows=100, n_dense=0))
    preprocess(cfg, tmp_path / "s", progress=False)
    a, b = both(cfg, tmp_path / "s", "train", 256)
    assert_same_batches(a, b)
    assert b[0].dense.shape == (256, 0)


def test_jagged_csv_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    rows = [f"{i % 2},{i * 0.5},u{i % 7},{'|'.join(f't{j}' for j in range(i % 4))}" for i in range(200)]
    path.write_text("y,x,user,tags\n" + "\n".join(rows) + "\n")
    schema = SchemaConfig(label="y", dense=["x"], categorical=["user", "tags"], multi_valued=["tags"])
    cfg = DataConfig(source=str(path), schema=schema, test_rows=50)
    preprocess(cfg, tmp_path / "s", rows_per_shard=64, progress=False)
    shards = ShardSet.open(tmp_path / "s")
    assert shards.multi_hot == ("tags",)
    for split in ("train", "test"):
        a, b = both(cfg, tmp_path / "s", split, 32)
        assert_same_batches(a, b)
    assert a[0].sparse["tags"].lengths.tolist()[:4] == [2, 3, 0, 1]


def test_rewrite_and_directory_rules(tmp_path: Path) -> None:
    cfg = DataConfig(synthetic=SyntheticConfig(train_rows=3000, test_rows=300))
    out = tmp_path / "s"
    preprocess(cfg, out, rows_per_shard=1000, progress=False)
    assert len(list(out.glob("train-*.arrow"))) == 3
    preprocess(cfg, out, rows_per_shard=2000, progress=False)  # replaces the files the old manifest listed
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "test-00000.arrow", "train-00000.arrow", "train-00001.arrow"]
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="not empty"):
        preprocess(cfg, busy, progress=False)
    with pytest.raises(DataError, match="without manifest.json"):
        open_source(DataConfig(source=str(busy)), "train", 8)
    (out / "train-00001.arrow").unlink()
    with pytest.raises(DataError, match="missing"):
        open_source(DataConfig(source=str(out)), "train", 8)


def test_file_without_test_split_writes_train_only(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.txt", synthetic_rows(50))
    m = preprocess(DataConfig(source=str(path), test_fraction=0), tmp_path / "s", progress=False)
    assert list(m.splits) == ["train"]
    with pytest.raises(DataError, match="no test split"):
        open_source(DataConfig(source=str(tmp_path / "s")), "test", 8)


@contextlib.contextmanager
def _no_warning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", MalformedRowsWarning)
        yield
