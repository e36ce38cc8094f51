"""`tierec inspect`: inferred roles and counts on real and written files; the schema TOML trains as it is."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from tierec.cli import main
from tierec.config import load_config
from tierec.data import open_source
from tierec.data.inspect import inspect_file

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "criteo"
HEAD = DATA / "train_head10000.txt"
CSV200 = DATA / "sample200_with_header.csv"
needs_data = pytest.mark.skipif(not HEAD.exists() or not CSV200.exists(), reason="../shared/data/criteo is absent")


def _raw_counts(path: Path, delimiter: str, header: bool) -> tuple[int, list[int], list[int]]:
    """rows, missing per column, distinct per column: counted here by plain splitting."""
    lines = path.read_text().splitlines()[1 if header else 0 :]
    fields = [line.split(delimiter) for line in lines]
    cols = list(zip(*fields))
    return len(lines), [sum(v == "" for v in c) for c in cols], [len({v for v in c if v != ""}) for c in cols]


@needs_data
def test_criteo_tsv_without_header(tmp_path: Path, capsys) -> None:
    report = inspect_file(HEAD)
    rows, missing, distinct = _raw_counts(HEAD, "\t", header=False)
    assert (report.format, report.header, report.rows, report.truncated) == ("criteo", False, rows, False)
    assert [c.missing for c in report.columns] == missing and [c.distinct for c in report.columns] == distinct
    assert [c.role for c in report.columns] == ["label"] + ["numeric"] * 13 + ["categorical"] * 26
    assert main(["inspect", str(HEAD), "--rows", "500", "--out", str(tmp_path / "s.toml")]) == 0
    out = capsys.readouterr().out
    assert "first 500 rows (more in the file)" in out
    cfg = load_config([str(tmp_path / "s.toml")], [])
    assert cfg.data.schema.preset == "criteo" and cfg.data.format == "criteo"


@needs_data
def test_csv_with_header_gives_a_schema_that_reads(tmp_path: Path, capsys) -> None:
    report = inspect_file(CSV200)
    rows, missing, distinct = _raw_counts(CSV200, ",", header=True)
    assert (report.format, report.header, report.rows) == ("csv", True, rows)
    assert [c.missing for c in report.columns] == missing and [c.distinct for c in report.columns] == distinct
    assert [c.name for c in report.column("label")] == ["label"]
    assert [c.name for c in report.column("numeric")] == [f"I{i}" for i in range(1, 14)]
    assert [c.name for c in report.column("categorical")] == [f"C{i}" for i in range(1, 27)]
    out = tmp_path / "schema.toml"
    assert main(["inspect", str(CSV200), "--out", str(out)]) == 0
    cfg = load_config([str(out)], [])
    assert cfg.data.schema.dense_transform == "log1p" and cfg.data.schema.label == "label"
    src = open_source(cfg.data, "all", 64)
    assert src.num_rows == 200 and len(src.feature_names) == 26 and src.n_dense == 13


def test_headerless_tsv_multi_valued_ids_and_malformed(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(300):
        tags = "|".join(f"t{x}" for x in rng.integers(0, 9, 1 + i % 3))
        price = "oops" if i % 50 == 7 else ("" if i % 10 == 3 else f"{rng.random() * 10:.2f}")
        lines.append(f"{i % 40}\t{price}\t{tags}\t{int(rng.random() < 0.3)}")
    lines.append("1\t2")  # a short row
    path = tmp_path / "t.tsv"
    path.write_text("\n".join(lines) + "\n")
    report = inspect_file(path)
    assert (report.format, report.header, report.rows, report.malformed_rows) == ("tsv", False, 300, 1)
    assert [(c.name, c.role, c.separator) for c in report.columns] == [
        ("c0", "numeric", ""), ("c1", "numeric", ""), ("c2", "multi-valued", "|"), ("c3", "label", "")]
    price = report.columns[1]
    assert (price.missing, price.malformed) == (30, 6)
    assert report.columns[0].distinct == 40


def test_parquet_and_the_toml_trains(tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(1)
    n = 400
    user, item = rng.integers(0, 30, n), rng.integers(0, 20, n)
    table = pa.table({"user_id": user, "item_id": item, "age": rng.random(n) * 60, "rating": rng.integers(1, 6, n)})
    pq.write_table(table, tmp_path / "r.parquet")
    report = inspect_file(tmp_path / "r.parquet", max_rows=300)
    assert (report.format, report.rows, report.truncated) == ("parquet", 300, True)
    assert [(c.name, c.role) for c in report.columns] == [
        ("user_id", "categorical"), ("item_id", "categorical"), ("age", "numeric"), ("rating", "label")]
    assert report.columns[0].distinct == len(set(user[:300].tolist()))
    out = tmp_path / "schema.toml"
    assert main(["inspect", str(tmp_path / "r.parquet"), "--out", str(out)]) == 0
    doc = tomllib.loads(out.read_text())
    assert doc["data"]["schema"]["label_threshold"] == 4  # not 0/1: the TOML says how clicks are made
    sets = ["train.batch_size=64", "embedding.dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]", "train.plots=false"]
    argv = ["train", "--config", str(out), "--run-dir", str(tmp_path / "run"), "--no-progress", *[x for s in sets for x in ("--set", s)]]
    assert main(argv) == 0


def test_inspect_errors_are_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "empty.csv").write_text("")
    for argv, needle in [(["inspect", str(tmp_path / "nope.csv")], "no such file"), (["inspect", str(tmp_path / "empty.csv")], "empty")]:
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err


def test_camel_case_id_columns_are_categorical(tmp_path: Path) -> None:
    """MovieLens names its columns userId and movieId: integer ids, not quantities (movieId was `numeric`)."""
    from tierec.data.inspect import id_named

    path = tmp_path / "ratings.csv"
    rng = np.random.default_rng(0)
    lines = ["userId,movieId,ItemID,play-count,rating,timestamp"]
    lines += [f"{u},{m},{i},{c},{r},{t}" for u, m, i, c, r, t in zip(rng.integers(1, 50, 300), rng.integers(1, 3000, 300),
              rng.integers(1, 90, 300), rng.integers(0, 40, 300), rng.integers(1, 6, 300), rng.integers(9e8, 1e9, 300))]
    path.write_text("\n".join(lines) + "\n")
    roles = {c.name: c.role for c in inspect_file(path).columns}
    assert roles == {"userId": "categorical", "movieId": "categorical", "ItemID": "categorical", "play-count": "numeric",
                     "rating": "label", "timestamp": "timestamp"}  # (issue 25: a time is the split column, not a feature)
    assert [n for n in ("movieId", "item_id", "ad-id", "ItemID", "Id", "valid", "paid", "video") if id_named(n)] == [
        "movieId", "item_id", "ad-id", "ItemID", "Id"]


def test_integer_codes_are_categorical_and_a_row_key_is_left_out(tmp_path: Path, capsys) -> None:
    """An Avazu-shaped log (written here): a unique row id, integer codes (C1, banner_pos, device_type, C14) and a
    count. Before, the codes were `numeric` and the row id a feature whose every value is seen once."""
    rng = np.random.default_rng(1)
    n = 1500
    lines = ["id,click,C1,banner_pos,site_id,device_type,C14,impressions"]
    for i in range(n):
        lines.append(f"{10**18 + i * 7919},{int(rng.random() < 0.2)},{1005 + rng.integers(0, 3)},{rng.integers(0, 3)},"
                     f"{rng.integers(0, 200):x}a,{rng.integers(0, 5)},{15700 + rng.integers(0, 400)},{rng.integers(0, 900)}")
    path = tmp_path / "avazu.csv"
    path.write_text("\n".join(lines) + "\n")
    roles = {c.name: c.role for c in inspect_file(path).columns}
    assert roles == {"id": "key", "click": "label", "C1": "categorical", "banner_pos": "categorical", "site_id": "categorical",
                     "device_type": "categorical", "C14": "categorical", "impressions": "numeric"}
    out = tmp_path / "schema.toml"
    assert main(["inspect", str(path), "--out", str(out)]) == 0
    assert "row key (left out)" in capsys.readouterr().out
    text = out.read_text()
    assert "--key id" in text
    cfg = load_config([str(out)], [])
    assert cfg.data.schema.categorical == ["C1", "banner_pos", "site_id", "device_type", "C14"]
    assert cfg.data.schema.dense == ["impressions"]
    src = open_source(cfg.data, "all", 512)
    assert src.num_rows == n and len(src.feature_names) == 5 and src.n_dense == 1
    # fewer rows than KEY_MIN_ROWS: an all-distinct column may be a rare feature in a small sample; it stays
    path.write_text("\n".join(lines[:501]) + "\n")
    assert {c.name: c.role for c in inspect_file(path).columns}["id"] == "categorical"
