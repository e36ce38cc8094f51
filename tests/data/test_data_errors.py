"""Bad input: malformed rows skipped and counted (one warning) or strict errors; bad files."""

from __future__ import annotations

import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_helpers import criteo_line, write_lines

from tierec.config import ConfigError, DataConfig, SchemaConfig
from tierec.data import DataError, MalformedRowError, MalformedRowsWarning, open_source


def criteo_file(tmp_path: Path) -> Path:
    """Ten lines; line 3 has 39 fields, line 5 a non-numeric I3, line 7 a bad hex C2, line 9 is empty."""
    lines = [criteo_line(i % 2) for i in range(10)]
    lines[2] = "\t".join(lines[2].split("\t")[:-1])
    fields = lines[4].split("\t")
    fields[3] = "abc"
    lines[4] = "\t".join(fields)
    fields = lines[6].split("\t")
    fields[15] = "zz12"
    lines[6] = "\t".join(fields)
    lines[8] = ""
    return write_lines(tmp_path / "train.txt", lines)


def test_malformed_rows_skipped_with_one_warning(tmp_path: Path) -> None:
    src = open_source(DataConfig(source=str(criteo_file(tmp_path)), test_fraction=0), "train", 4)
    with pytest.warns(MalformedRowsWarning) as record:
        batches = list(src)
    assert len(record) == 1
    assert sum(b.size for b in batches) == 6
    report = src.problems
    assert report is not None and report.malformed == 4 and report.first_lines == [3, 5, 7, 9]
    assert report.examples[0][1] == "expected 40 tab-separated fields, found 39"
    assert report.examples[1][1] == "column I3: 'abc' is not a number"
    assert report.examples[2][1] == "column C2: 'zz12' is not a hex id of 1-8 digits"
    assert report.examples[3][1] == "label is empty"
    message = str(record[0].message)
    assert "skipped 4 malformed rows" in message and "lines 3, 5, 7, 9" in message and "train.txt" in message


@pytest.mark.parametrize(
    ("test_rows", "split", "expected"),
    [(4, "train", [3, 5]), (4, "test", [7, 9]), (0, "train", [3, 5, 7, 9])],
)
def test_line_numbers_are_file_lines_in_every_split(tmp_path: Path, test_rows: int, split: str, expected: list[int]) -> None:
    cfg = DataConfig(source=str(criteo_file(tmp_path)), test_rows=test_rows, test_fraction=0)
    src = open_source(cfg, split, 3)
    with pytest.warns(MalformedRowsWarning):
        list(src)
    assert src.problems is not None and src.problems.first_lines == expected


def test_csv_header_counts_as_line_one(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("y,x,c\n1,2,a\n0,oops,b\n1,3\n0,4,d\n")
    src = open_source(DataConfig(source=str(path), schema=SchemaConfig(label="y", dense=["x"], categorical=["c"]), test_fraction=0), "train", 8)
    with pytest.warns(MalformedRowsWarning):
        (b,) = list(src)
    assert b.size == 2 and src.problems is not None
    assert src.problems.examples == [(3, "column x: 'oops' is not a number"), (4, "expected 3 comma-separated fields, found 2")]


def test_many_malformed_rows_are_counted_beyond_the_examples(tmp_path: Path) -> None:
    lines = [criteo_line(0) if i % 3 else "1\t2" for i in range(300)]
    src = open_source(DataConfig(source=str(write_lines(tmp_path / "t.txt", lines)), test_fraction=0), "train", 64)
    with pytest.warns(MalformedRowsWarning, match="skipped 100 malformed rows"):
        assert sum(b.size for b in src) == 200
    assert src.problems is not None and src.problems.first_lines == [1, 4, 7, 10, 13]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (2, "train.txt:3: expected 40 tab-separated fields, found 39"),
        (4, "train.txt:5: column I3: 'abc' is not a number"),
    ],
)
def test_strict_raises_naming_file_line_and_problem(tmp_path: Path, line: int, message: str) -> None:
    path = criteo_file(tmp_path)
    lines = path.read_text().splitlines()
    good = criteo_line(0)
    keep = [lines[i] if i == line else good for i in range(len(lines))]  # only the one bad line
    write_lines(path, keep)
    src = open_source(DataConfig(source=str(path), test_fraction=0, strict=True), "train", 4)
    with pytest.raises(MalformedRowError) as err:
        list(src)
    assert str(err.value).endswith(message)
    assert isinstance(err.value, ConfigError) and "\n" not in str(err.value)


def test_strict_reports_the_first_bad_line(tmp_path: Path) -> None:
    src = open_source(DataConfig(source=str(criteo_file(tmp_path)), test_fraction=0, strict=True), "train", 100)
    with pytest.raises(MalformedRowError, match=r"train\.txt:3: expected 40"):
        list(src)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        open_source(DataConfig(source=str(tmp_path / "nope.txt")), "train", 4)
    with pytest.raises(DataError, match="no such file"):
        open_source(DataConfig(source=str(tmp_path / "nope.parquet")), "train", 4)


def test_empty_files(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="empty.txt: file is empty"):
        open_source(DataConfig(source=str(tmp_path / "empty.txt")), "train", 4)
    (tmp_path / "head.csv").write_text("y,x\n")
    with pytest.raises(DataError, match="header but no data rows"):
        open_source(DataConfig(source=str(tmp_path / "head.csv"), schema=SchemaConfig(label="y", dense=["x"])), "train", 4)
    (tmp_path / "empty.parquet").write_text("")
    with pytest.raises(DataError, match="empty"):
        open_source(DataConfig(source=str(tmp_path / "empty.parquet"), schema=SchemaConfig(label="y", dense=["x"])), "train", 4)


def test_missing_column(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("y,x\n1,2\n")
    schema = SchemaConfig(label="y", dense=["x", "z"], categorical=["c"])
    with pytest.raises(DataError, match=r"schema names column\(s\) \['z', 'c'\] that the file does not have"):
        open_source(DataConfig(source=str(path), schema=schema), "train", 4)
    pq.write_table(pa.table({"y": [1], "x": [2.0]}), tmp_path / "t.parquet")
    with pytest.raises(DataError, match=r"\['z', 'c'\]"):
        open_source(DataConfig(source=str(tmp_path / "t.parquet"), schema=schema), "train", 4)
    headerless = SchemaConfig(header=False, columns=["y", "x"], label="y", dense=["x", "z"])
    with pytest.raises(DataError, match="not in data.schema.columns"):
        open_source(DataConfig(source=str(path), schema=headerless), "train", 4)
    with pytest.raises(DataError, match="schema.columns does not name"):
        open_source(DataConfig(source=str(path), schema=SchemaConfig(header=False, label="y", dense=["x"])), "train", 4)


def test_wrong_delimiter_is_an_error_not_an_empty_pass(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("".join(criteo_line(0).replace("\t", ",") + "\n" for _ in range(5)))
    with pytest.raises(DataError, match="no well-formed rows"):
        list(open_source(DataConfig(source=str(path), test_fraction=0), "train", 4))


def test_parquet_bad_values_by_row(tmp_path: Path) -> None:
    pq.write_table(pa.table({"y": [1.0, None, 2.0, 0.0], "x": ["1", "2", "3", "q"]}), tmp_path / "t.parquet")
    src = open_source(DataConfig(source=str(tmp_path / "t.parquet"), schema=SchemaConfig(label="y", dense=["x"]), test_fraction=0), "train", 8)
    with pytest.raises(DataError, match=r"t\.parquet: row 3: label 2\.0 is not 0 or 1"):  # a wrong label is never skipped
        list(src)
    pq.write_table(pa.table({"y": [1.0, None, 1.0, 0.0], "x": ["1", "2", "3", "q"]}), tmp_path / "t.parquet")
    src = open_source(DataConfig(source=str(tmp_path / "t.parquet"), schema=SchemaConfig(label="y", dense=["x"]), test_fraction=0), "train", 8)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        (b,) = list(src)
    assert b.size == 2 and len(record) == 1
    assert src.problems is not None and src.problems.unit == "row"
    assert src.problems.examples == [(2, "label is empty"), (4, "column x: 'q' is not a number")]
    strict = DataConfig(source=str(tmp_path / "t.parquet"), schema=SchemaConfig(label="y", dense=["x"]), test_fraction=0, strict=True)
    with pytest.raises(MalformedRowError, match=r"t\.parquet: row 2: label is empty"):
        list(open_source(strict, "train", 8))


def test_schema_config_validation() -> None:
    with pytest.raises(ConfigError, match="preset"):
        SchemaConfig(preset="avazu")
    with pytest.raises(ConfigError, match="leave data.schema.dense"):
        SchemaConfig(preset="criteo", dense=["I1"])
    with pytest.raises(ConfigError, match="dense_transform"):
        SchemaConfig(dense_transform="log")
    with pytest.raises(ConfigError, match="not categorical"):
        SchemaConfig(categorical=["a"], multi_valued=["b"])
    with pytest.raises(DataError, match="split must be"):
        open_source(DataConfig(), "valid", 4)
    with pytest.raises(DataError, match="batch_size"):
        open_source(DataConfig(), "train", 0)
