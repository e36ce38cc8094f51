"""Readers: Criteo TSV parsing, the generic CSV/TSV/Parquet schema path, splits."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch
from data_helpers import CRITEO_CSV, CRITEO_HEAD, assert_same_batches, criteo_line, needs_criteo, needs_criteo_csv, write_lines

from tierec.config import DataConfig, SchemaConfig
from tierec.data import DataError, infer_format, open_source
from tierec.data.hashing import HEX_MISSING, hash_text_id, hex_id

MISSING_C2 = (1 << 33) | HEX_MISSING


def read_all(cfg: DataConfig, split: str = "train", batch_size: int = 1000) -> list:
    return list(open_source(cfg, split, batch_size))


def test_criteo_row_values(tmp_path: Path) -> None:
    ints = [5, -3, None, 0, 1, 2, 3, 4, 5, 6, 7, 8, 1000000]
    cats = ["68FD1E64", "", *[f"{f:08x}" for f in range(2, 25)], "ffffffff"]
    path = write_lines(tmp_path / "t.txt", [criteo_line(1, ints, cats), criteo_line(0)])
    (b,) = read_all(DataConfig(source=str(path), test_fraction=0))
    assert b.size == 2 and b.labels.tolist() == [1.0, 0.0]
    assert b.dense.dtype == torch.float32 and b.dense.shape == (2, 13)
    expected = [math.log1p(max(v, 0)) if v is not None else 0.0 for v in ints]
    assert torch.allclose(b.dense[0], torch.tensor(expected, dtype=torch.float32))
    assert b.sparse.keys == tuple(f"C{i}" for i in range(1, 27))
    assert b.sparse["C1"].values[0].item() == 0x68FD1E64
    assert b.sparse["C2"].values[0].item() == MISSING_C2 == hex_id(1, None)
    assert b.sparse["C3"].values[0].item() == (2 << 33) | 2
    assert b.sparse["C26"].values[0].item() == (25 << 33) | 0xFFFFFFFF
    assert torch.equal(b.sparse.offsets, torch.arange(26 * 2 + 1))
    assert b.sparse.values.dtype == torch.int64 and bool((b.sparse.values >= 0).all())


def test_ids_never_collide_across_features(tmp_path: Path) -> None:
    same = ["0000abcd"] * 26
    path = write_lines(tmp_path / "t.txt", [criteo_line(0, cats=same), criteo_line(1, cats=[""] * 26)])
    (b,) = read_all(DataConfig(source=str(path), test_fraction=0))
    assert len(set(b.sparse.values.tolist())) == 52


def test_float_and_exponent_dense(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("y,a,b,c\n1,1.5,-2e3,nan\n0,.25,1E2,\n")
    cfg = DataConfig(source=str(path), schema=SchemaConfig(label="y", dense=["a", "b", "c"]), test_fraction=0)
    (b,) = read_all(cfg)
    assert b.dense.tolist() == [[1.5, -2000.0, 0.0], [0.25, 100.0, 0.0]]
    assert b.sparse.keys == () and b.sparse.values.numel() == 0


@needs_criteo
def test_real_criteo_sample_and_split() -> None:
    cfg = DataConfig(source=str(CRITEO_HEAD), test_rows=2000)
    train, test = open_source(cfg, "train", 4096), open_source(cfg, "test", 4096)
    assert (train.num_rows, test.num_rows, train.num_batches) == (8000, 2000, 2)
    tr, te = list(train), list(test)
    assert [b.size for b in tr] == [4096, 3904] and [b.size for b in te] == [2000]
    labels = torch.cat([b.labels for b in tr + te])
    assert labels.numel() == 10000 and round(labels.mean().item(), 3) == 0.218
    assert train.problems is not None and train.problems.malformed == 0
    # the split is by position: the whole file read at once gives the same rows in order
    whole = read_all(DataConfig(source=str(CRITEO_HEAD), test_fraction=0), batch_size=10000)[0]
    assert torch.equal(whole.labels, labels)
    assert torch.equal(whole.sparse["C3"].values, torch.cat([b.sparse["C3"].values for b in tr + te]))


@needs_criteo_csv
def test_csv_with_header_matches_tsv_path(tmp_path: Path) -> None:
    csv_cfg = DataConfig(source=str(CRITEO_CSV), schema=SchemaConfig(preset="criteo"), test_fraction=0)
    via_csv = read_all(csv_cfg, batch_size=64)
    assert sum(b.size for b in via_csv) == 200
    # the same rows as raw Criteo TSV (converted in tmp_path) go through the Criteo reader
    table = pacsv.read_csv(CRITEO_CSV, convert_options=pacsv.ConvertOptions(column_types={}, strings_can_be_null=False))
    cols = [table.column(i).cast(pa.string()).fill_null("").to_pylist() for i in range(table.num_columns)]
    lines = ["\t".join(row) for row in zip(*cols)]
    tsv = write_lines(tmp_path / "same.txt", lines)
    via_tsv = read_all(DataConfig(source=str(tsv), test_fraction=0), batch_size=64)
    assert_same_batches(via_csv, via_tsv)
    first = via_csv[0]
    c1 = cols[table.column_names.index("C1")][0]
    assert first.sparse["C1"].values[0].item() == (int(c1, 16) if c1 else hex_id(0, None))


@needs_criteo_csv
def test_parquet_copy_matches_csv(tmp_path: Path) -> None:
    table = pacsv.read_csv(CRITEO_CSV)  # typed: ints, strings with nulls
    pq.write_table(table, tmp_path / "s.parquet", row_group_size=50)
    cfg = DataConfig(source=str(CRITEO_CSV), schema=SchemaConfig(preset="criteo"), test_rows=30)
    pcfg = DataConfig(source=str(tmp_path / "s.parquet"), schema=SchemaConfig(preset="criteo"), test_rows=30)
    for split in ("train", "test"):
        assert_same_batches(read_all(cfg, split, 64), read_all(pcfg, split, 64))


def test_generic_hash_ids_csv_and_parquet_agree(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text('click,price,user,item,tags\n1,2.5,alice,42,"a|b||c"\n0,,bob,-7,\n1,3,"x,y",0,z\n')
    schema = SchemaConfig(label="click", dense=["price"], categorical=["user", "item", "tags"], multi_valued=["tags"])
    (b,) = read_all(DataConfig(source=str(path), schema=schema, test_fraction=0))
    assert b.dense[:, 0].tolist() == [2.5, 0.0, 3.0]
    assert b.sparse["user"].values.tolist() == [hash_text_id("user", v) for v in ["alice", "bob", "x,y"]]
    assert b.sparse["item"].values.tolist() == [hash_text_id("item", v) for v in ["42", "-7", "0"]]
    tags = b.sparse["tags"]
    assert tags.lengths.tolist() == [3, 0, 1]
    assert tags.values.tolist() == [hash_text_id("tags", v) for v in ["a", "b", "c", "z"]]
    assert hash_text_id("user", "42") != hash_text_id("item", "42")
    # typed Parquet: integer ids, list<string> bags, dictionary strings, a null user
    table = pa.table(
        {
            "click": pa.array([1, 0, 1], pa.int8()),
            "price": [2.5, None, 3.0],
            "user": pa.array(["alice", "bob", "x,y"]).dictionary_encode(),
            "item": pa.array([42, -7, 0], pa.int64()),
            "tags": pa.array([["a", "b", None, "c"], None, ["z"]], pa.list_(pa.string())),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    (p,) = read_all(DataConfig(source=str(tmp_path / "t.parquet"), schema=schema, test_fraction=0))
    assert_same_batches([b], [p])


def test_multi_valued_hex_and_tsv(tmp_path: Path) -> None:
    path = tmp_path / "t.tsv"
    path.write_text("y\tc\n1\t0a;ff\n0\t\n")
    schema = SchemaConfig(label="y", categorical=["c"], multi_valued=["c"], separator=";", categorical_encoding="hex")
    (b,) = read_all(DataConfig(source=str(path), schema=schema, test_fraction=0))
    assert b.sparse["c"].values.tolist() == [0x0A, 0xFF] and b.sparse["c"].lengths.tolist() == [2, 0]


def test_crlf_and_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbfy,x,c\r\n1,2,a\r\n0,3,b\r\n")
    cfg = DataConfig(source=str(path), schema=SchemaConfig(label="y", dense=["x"], categorical=["c"]), test_rows=1)
    (train,), (test,) = read_all(cfg, "train"), read_all(cfg, "test")
    assert train.dense.tolist() == [[2.0]] and test.dense.tolist() == [[3.0]]
    assert test.sparse["c"].values.tolist() == [hash_text_id("c", "b")]


def test_headerless_csv_with_columns(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("1,7,u1\n0,8,u2\n")
    schema = SchemaConfig(header=False, columns=["y", "x", "u"], label="y", dense=["x"], categorical=["u"])
    (b,) = read_all(DataConfig(source=str(path), schema=schema, test_fraction=0))
    assert b.dense[:, 0].tolist() == [7.0, 8.0] and b.sparse["u"].values[1].item() == hash_text_id("u", "u2")


def test_format_inference(tmp_path: Path) -> None:
    assert infer_format("synthetic") == "synthetic"
    assert infer_format("a/b.TXT") == "criteo" and infer_format("x.csv") == "csv" and infer_format("x.tsv") == "tsv"
    assert infer_format("x.parquet") == "parquet" and infer_format(str(tmp_path)) == "shards"
    assert infer_format("x.dat", "tsv") == "tsv"
    with pytest.raises(DataError, match="compressed"):
        infer_format("train.txt.gz")
    (tmp_path / "x.dat").write_text("1\n")
    with pytest.raises(DataError, match="set data.format"):
        infer_format(str(tmp_path / "x.dat"))


def test_test_fraction_and_test_source(tmp_path: Path) -> None:
    lines = [criteo_line(i % 2) for i in range(10)]
    path = write_lines(tmp_path / "t.txt", lines)
    cfg = DataConfig(source=str(path), test_fraction=0.3)
    assert [open_source(cfg, s, 4).num_rows for s in ("train", "test", "all")] == [7, 3, 10]
    other = write_lines(tmp_path / "other.txt", lines[:4])
    cfg = DataConfig(source=str(path), test_source=str(other))
    assert [open_source(cfg, s, 4).num_rows for s in ("train", "test")] == [10, 4]
    with pytest.raises(DataError, match="no test split"):
        open_source(DataConfig(source=str(path), test_fraction=0), "test", 4)
    with pytest.raises(DataError, match="leave no training rows"):
        open_source(DataConfig(source=str(path), test_rows=10), "train", 4)


def test_start_batch_on_files(tmp_path: Path) -> None:
    from data_helpers import synthetic_rows

    path = write_lines(tmp_path / "t.txt", synthetic_rows(300))
    cfg = DataConfig(source=str(path), test_rows=50)
    full = read_all(cfg, "train", 32)
    assert_same_batches(list(open_source(cfg, "train", 32, start_batch=3)), full[3:])
    assert [b.size for b in open_source(cfg, "train", 32, drop_last=True)] == [32] * 7


def test_small_blocks_give_same_rows(tmp_path: Path) -> None:
    """Rows straddling pyarrow's block boundaries are read once and in order."""
    from data_helpers import synthetic_rows

    from tierec.data.blocks import concat_slices
    from tierec.data.errors import ProblemReport
    from tierec.data.schema import criteo_schema
    from tierec.data.text import TextFile

    path = write_lines(tmp_path / "t.txt", synthetic_rows(200))
    f = TextFile.open(path, criteo_schema())
    big = list(f.blocks(0, 200, ProblemReport("x"), strict=False))
    small = list(f.blocks(0, 200, ProblemReport("x"), strict=False, block_bytes=4096))
    assert len(small) > len(big)
    a, b = (concat_slices([(blk, 0, blk.size) for blk in blocks]) for blocks in (big, small))  # feature-major
    for name in ("labels", "dense", "values", "offsets"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
