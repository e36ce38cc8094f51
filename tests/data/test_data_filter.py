"""data.schema.filter: rows failing a condition on a column are dropped, not counted as malformed."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from tierec.config import ConfigError, load_config
from tierec.data import DataError, MalformedRowsWarning, open_source


def _ratings(tmp_path: Path) -> Path:
    f = tmp_path / "r.csv"
    rows = [(i % 6, f"u{i % 7}", i) for i in range(60)]  # ratings 0..5, 0 = not rated
    f.write_text("rating,user,t\n" + "".join(f"{r},{u},{t}\n" for r, u, t in rows))
    return f


def _read(f: Path, *extra: str, split: str = "all") -> tuple[np.ndarray, np.ndarray]:
    over = [f"data.source={f}", "data.schema.label=\"rating\"", "data.schema.categorical=[\"user\"]",
            "data.schema.label_threshold=4", "data.test_rows=6", *extra]
    src = open_source(load_config(None, over).data, split, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MalformedRowsWarning)  # a filtered row is not a malformed one
        batches = list(src)
    labels = np.concatenate([b.labels.numpy() for b in batches])
    return labels, np.array([len(labels)])


def test_rows_failing_the_filter_are_dropped_silently(tmp_path: Path) -> None:
    f = _ratings(tmp_path)
    every, _ = _read(f)
    kept, _ = _read(f, "data.schema.filter=\"rating != 0\"")
    assert every.size == 60 and kept.size == 50  # the ten ratings of 0
    assert kept.sum() == every.sum()  # the same clicks (ratings >= 4): only unrated rows went
    low, _ = _read(f, "data.schema.filter=\"t < 30\"")  # a column the model does not use
    assert low.size == 30


def test_splits_and_training_see_the_filtered_rows(tmp_path: Path) -> None:
    f = _ratings(tmp_path)
    train, _ = _read(f, "data.schema.filter=\"rating != 0\"", split="train")
    test, _ = _read(f, "data.schema.filter=\"rating != 0\"", split="test")
    assert train.size + test.size == 50


@pytest.mark.parametrize("text, says", [("rating", "COLUMN OP NUMBER"), ("rating != zero", "not a number"),
                                        ("rating ~ 0", "COLUMN OP NUMBER")])
def test_a_bad_filter_is_one_line_naming_the_key(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=rf"data\.schema\.filter .*{says}"):
        _read(_ratings(tmp_path), f"data.schema.filter={text!r}".replace("'", '"'))


def test_a_filter_on_a_column_the_file_lacks_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "h.csv"
    f.write_text("".join(f"{i % 6},u{i}\n" for i in range(20)))
    with pytest.raises(DataError, match="data.schema.filter names column 'stars'"):
        _read(f, "data.schema.header=false", "data.schema.columns=[\"rating\", \"user\"]", "data.schema.filter=\"stars > 0\"")
