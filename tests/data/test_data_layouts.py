"""Files as people write them (`::` separators, a separator after the last field, CRLF), the reader protocol,
splits by a column and the warning for a tail split of a file sorted by a key. Every file is written here."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from tierec.config import ConfigError, DataConfig, SchemaConfig
from tierec.data import SplitWarning, open_dataset, open_source
from tierec.data.keys import read_key_columns
from tierec.data.reader import FORMAT_READERS, open_reader


def _ratings(n: int, seed: int = 0, sort_by_user: bool = True) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    rows = [(int(u), int(i), int(r), int(t)) for u, i, r, t in zip(rng.integers(1, 60, n), rng.integers(1, 300, n),
                                                                     rng.integers(1, 6, n), rng.integers(9.7e8, 1.0e9, n))]
    return sorted(rows) if sort_by_user else rows


def _schema(**kw: object) -> SchemaConfig:
    base = dict(label="r", label_threshold=4, categorical=["u", "i"], header=False, columns=["u", "i", "r", "t"])
    return SchemaConfig(**{**base, **kw})  # type: ignore[arg-type]


def _rows_of(cfg: DataConfig, split: str = "all") -> tuple[np.ndarray, np.ndarray]:
    """(labels, user ids) of every row of a split."""
    labels, users = [], []
    for b in open_source(cfg, split, 64):
        labels.append(b.labels.numpy())
        users.append(b.sparse["u"].values.numpy())
    return np.concatenate(labels), np.concatenate(users)


def test_double_colon_trailing_separator_and_crlf_read_like_plain_csv(tmp_path: Path) -> None:
    rows = _ratings(300)
    plain = tmp_path / "plain.csv"
    plain.write_text("".join(f"{u},{i},{r},{t}\n" for u, i, r, t in rows))
    expected = _rows_of(DataConfig(source=str(plain), schema=_schema(), test_fraction=0))
    assert expected[0].size == 300
    layouts = {
        "ml.dat": ("".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in rows), "::"),
        "trailing.csv": ("".join(f"{u},{i},{r},{t},\r\n" for u, i, r, t in rows), ","),
        "crlf.tsv": ("".join(f"{u}\t{i}\t{r}\t{t}\r\n" for u, i, r, t in rows), "\t"),
    }
    for name, (text, delimiter) in layouts.items():
        path = tmp_path / name
        path.write_bytes(text.encode())
        cfg = DataConfig(source=str(path), format="csv", schema=_schema(delimiter=delimiter), test_fraction=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no malformed rows
            got = _rows_of(cfg)
        assert all(np.array_equal(a, b) for a, b in zip(got, expected)), name
    # a header with the trailing separator too (Amazon's ratings file); the values of the last named column are right
    path = tmp_path / "amazon.csv"
    path.write_bytes(("u,i,r,t,\r\n" + "".join(f"{u},{i},{r},{t},\r\n" for u, i, r, t in rows)).encode())
    cfg = DataConfig(source=str(path), schema=_schema(header=True, columns=[], dense=["t"]), test_fraction=0)
    dense = np.concatenate([b.dense.numpy()[:, 0] for b in open_source(cfg, "all", 64)])
    assert np.array_equal(dense, np.array([t for *_, t in rows], np.float32))


def test_a_double_colon_file_gives_its_keys_and_a_long_one_streams(tmp_path: Path) -> None:
    rows = _ratings(5000, seed=1)
    path = tmp_path / "big.dat"
    path.write_text("".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in rows))
    cfg = DataConfig(source=str(path), format="csv", schema=_schema(delimiter="::"), test_fraction=0)
    reader = open_reader(path, "csv", cfg.schema)
    got = [b for b in reader.blocks(0, reader.num_rows, reader.new_report(), strict=False, block_bytes=4096)]  # type: ignore[call-arg]
    assert sum(b.size for b in got) == 5000
    keys = read_key_columns(cfg, ["t", "u"], np.array([0, 4999]))
    assert keys["t"].to_pylist() == [str(rows[0][3]), str(rows[-1][3])] and keys["u"].to_pylist() == [str(rows[0][0]), str(rows[-1][0])]


def test_every_file_format_is_one_reader_of_one_protocol() -> None:
    assert set(FORMAT_READERS) == {"criteo", "csv", "tsv", "parquet"}
    with pytest.raises(ConfigError, match="data.schema.delimiter"):
        SchemaConfig(delimiter="\n")


def test_column_split_puts_the_latest_rows_in_test_and_keeps_ties_together(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    n = 1000
    times = rng.integers(0, 200, n) * 10  # many equal times
    path = tmp_path / "log.csv"
    path.write_text("y,u,t\n" + "".join(f"{int(rng.random() < 0.3)},u{rng.integers(0, 50)},{t}\n" for t in times))
    schema = SchemaConfig(label="y", categorical=["u"])
    cfg = DataConfig(source=str(path), schema=schema, split="column", split_column="t", test_fraction=0.2, validation_fraction=0.1)
    data = open_dataset(cfg)
    seen = {}
    for split in ("train", "validation", "test"):
        src = data.source(split, 100)
        rows = np.concatenate([b.rows for b in src.row_blocks()])
        seen[split] = times[rows]
        assert src.num_rows == rows.size  # exact below a million rows
    assert seen["train"].max() < seen["validation"].min() <= seen["validation"].max() < seen["test"].min()
    assert sum(v.size for v in seen.values()) == n
    assert abs(seen["test"].size - 200) <= 15 and abs(seen["validation"].size - 100) <= 15  # ties move the edge a little
    with pytest.raises(ConfigError, match="data.split_column"):
        DataConfig(source=str(path), split="column")
    with pytest.raises(ConfigError, match="does not have"):
        open_source(DataConfig(source=str(path), schema=schema, split="column", split_column="when"), "train", 10)


def test_column_split_of_a_large_file_streams_a_sample(tmp_path: Path, monkeypatch) -> None:
    """Above the sample size the cutoffs come from a reservoir: the split sizes are close, not exact."""
    from tierec.data import column_split

    monkeypatch.setattr(column_split, "SAMPLE_VALUES", 500)
    path = tmp_path / "log.csv"
    times = np.random.default_rng(3).permutation(20_000)
    path.write_text("y,u,t\n" + "".join(f"{t % 2},u{t % 7},{t}\n" for t in times))
    cfg = DataConfig(source=str(path), schema=SchemaConfig(label="y", categorical=["u"]), split="column", split_column="t", test_fraction=0.25)
    src = open_source(cfg, "test", 1000)
    got = sum(b.size for b in src)
    assert abs(got - 5000) < 600 and abs(src.num_rows - 5000) < 600  # type: ignore[operator]


def test_a_tail_split_of_a_file_sorted_by_user_warns_once(tmp_path: Path) -> None:
    path = tmp_path / "sorted.csv"
    path.write_text("".join(f"{u},{i},{r},{t}\n" for u, i, r, t in _ratings(2000)))
    cfg = DataConfig(source=str(path), schema=_schema(), test_fraction=0.2)
    with pytest.warns(SplitWarning, match="sorted by u") as caught:
        data = open_dataset(cfg)
        data.source("train", 100)
        data.source("test", 100)
    assert len([w for w in caught if issubclass(w.category, SplitWarning)]) == 1
    assert "\n" not in str(caught[0].message)
    shuffled = tmp_path / "shuffled.csv"
    shuffled.write_text("".join(f"{u},{i},{r},{t}\n" for u, i, r, t in _ratings(2000, sort_by_user=False)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_source(DataConfig(source=str(shuffled), schema=_schema(), test_fraction=0.2), "test", 100)
