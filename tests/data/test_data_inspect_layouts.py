"""`tierec inspect` on files as people write them (all written here): headerless ratings with `::` and Unix times,
a quoted semicolon file with a latin-1 byte and ISBN-like ids, a -10..10 scale, constant and near-unique columns,
the --delimiter / --header / --encoding options, and no traceback on any bytes."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np

from tierec.cli import main
from tierec.config import load_config
from tierec.data import open_source
from tierec.data.inspect import inspect_file

TINY = ["train.batch_size=64", "embedding.dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]", "train.plots=false", "train.max_steps=5"]


def _movielens_like(path: Path, n: int = 3000) -> None:
    rng = np.random.default_rng(0)
    t0 = 978_300_000
    lines = [f"{rng.integers(1, 400)}::{rng.integers(1, 3000)}::{rng.integers(1, 6)}::{t0 + int(rng.integers(0, 10**7))}" for _ in range(n)]
    path.write_text("\n".join(lines) + "\n")


def test_headerless_ratings_give_a_label_threshold_and_a_time_split_and_train(tmp_path: Path, capsys) -> None:
    path = tmp_path / "ratings.dat"
    _movielens_like(path)
    report = inspect_file(path)
    assert (report.format, report.header, report.delimiter) == ("csv", False, "::")
    assert [c.role for c in report.columns] == ["categorical", "categorical", "label", "timestamp"]
    assert report.columns[2].threshold == 4
    out = tmp_path / "schema.toml"
    assert main(["inspect", str(path), "--out", str(out)]) == 0
    text = out.read_text()
    doc = tomllib.loads(text)
    assert doc["data"]["split"] == "column" and doc["data"]["split_column"] == "c3"
    schema = doc["data"]["schema"]
    assert (schema["delimiter"], schema["header"], schema["label"], schema["label_threshold"]) == ("::", False, "c2", 4)
    assert "c3" not in schema["dense"] + schema["categorical"]
    assert all(f"#   c{j}:" in text for j in range(4))  # every guess explained
    argv = ["train", "--config", str(out), "--run-dir", str(tmp_path / "run"), "--no-progress", *[x for s in TINY for x in ("--set", s)]]
    assert main(argv) == 0


def test_quoted_semicolons_latin1_and_letters_in_some_ids(tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(1)
    lines = []
    for i in range(2000):
        isbn = f"{rng.integers(10**8, 10**9)}" + ("X" if i % 12 == 0 else str(rng.integers(0, 10)))
        lines.append(f'"{rng.integers(1, 300)}";"{isbn}";"{rng.integers(0, 11)}"'.encode())
    lines[7] = b'"27\xe9";"0345451040";"3"'  # a latin-1 byte
    path = tmp_path / "books.csv"
    path.write_bytes(b"\r\n".join(lines) + b"\r\n")
    report = inspect_file(path, max_rows=500)
    assert (report.delimiter, report.header, report.rows) == (";", False, 500)
    assert [c.role for c in report.columns] == ["categorical", "categorical", "label"]
    assert "letters" in report.columns[1].reason
    assert any("not UTF-8" in n for n in report.notes)
    assert main(["inspect", str(path), "--out", str(tmp_path / "s.toml")]) == 0
    cfg = load_config([str(tmp_path / "s.toml")], [])
    assert cfg.data.schema.delimiter == ";" and cfg.data.schema.label_threshold == 8
    assert sum(b.size for b in open_source(cfg.data, "all", 256)) == 1999  # the row with the latin-1 byte is skipped
    # told the encoding: no note
    assert not inspect_file(path, encoding="latin-1").notes


def test_a_scale_around_zero_constant_and_near_unique_columns(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    lines = [f"{i},{rng.integers(1, 500)},{rng.integers(-10, 11)},same,u{i % 1900}" for i in range(2000)]
    path = tmp_path / "jokes.csv"
    path.write_text("\n".join(lines) + "\n")
    report = inspect_file(path)
    roles = [c.role for c in report.columns]
    assert roles == ["key", "categorical", "label", "constant", "key"], [(c.name, c.role, c.reason) for c in report.columns]
    assert report.columns[2].threshold == 0 and "0 and above" in report.columns[2].threshold_reason
    assert "one value" in report.columns[3].reason and "distinct" in report.columns[4].reason


def test_options_say_how_the_file_is_written(tmp_path: Path, capsys) -> None:
    path = tmp_path / "odd.txt"
    path.write_text("a|b|c\n" + "".join(f"{i}|x{i % 3}|{i % 2}\n" for i in range(50)))
    assert inspect_file(path).delimiter == "|"
    assert main(["inspect", str(path), "--delimiter", "pipe", "--no-header"]) == 0
    out = capsys.readouterr().out
    assert "no header line" in out and "c0" in out
    assert main(["inspect", str(path), "--header", "--delimiter", ","]) == 0  # one column then: nothing to split
    assert main(["inspect", str(path), "--encoding", "nonsense"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_no_traceback_on_any_bytes(tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(3)
    for k in range(12):
        path = tmp_path / f"r{k}.csv"
        raw = rng.integers(0, 256, int(rng.integers(1, 4000)), dtype=np.uint8).tobytes()
        if k % 3 == 0:
            raw = b"a,b\n1,2\n" + raw
        path.write_bytes(raw)
        capsys.readouterr()
        code = main(["inspect", str(path), "--out", str(tmp_path / "s.toml")])
        err = capsys.readouterr().err
        assert code in (0, 2) and "Traceback" not in err and err.count("\n") <= 1, err
