"""benchmarks.public_data (issue 25's table): the inspected schemas of the public files are the ones the table
was measured with, the verdicts read right, and the table renders. Skips when ../shared/data is absent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import public_data
from tierec.config import load_config


def test_verdict() -> None:
    assert public_data.verdict(0.80, 0.805, 0.70) == "meets"
    assert public_data.verdict(0.80, 0.82, 0.70) == "misses: 0.0200 below LR"
    assert public_data.verdict(0.80, 0.80, 0.81) == "misses: not above item popularity"


def test_table_renders(tmp_path: Path) -> None:
    base = {"train_rows": 100, "test_rows": 20, "logistic_regression_auc": 0.7, "item_popularity_auc": 0.6}
    runs = [{"seed": 0, "test_auc": 0.71}, {"seed": 1, "test_auc": 0.69}]
    res = {"results": [{"file": "f", "model": "dlrm", "runs": runs, "mean_test_auc": 0.70, "baselines": base}]}
    (tmp_path / "r.json").write_text(json.dumps(res))
    table = public_data.markdown([tmp_path / "r.json"])
    assert "| f (100 / 20) | 0.7000 (+0.0000, 2) | not run | not run | not run | 0.7000 | 0.6000 |" in table


@pytest.mark.parametrize("name", ["criteo", "movielens", "amazon", "frappe", "lastfm"])
def test_inspected_schema_trains_as_measured(name: str, tmp_path: Path) -> None:
    path, _ = public_data.FILES[name]
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    cfg = load_config([str(public_data.inspect(path, tmp_path / "s.toml"))], [])
    if name == "criteo":  # the Criteo layout, recognised
        assert cfg.data.schema.preset == "criteo" and cfg.data.negatives == 0
    elif name in ("movielens", "amazon"):  # explicit ratings: rating >= 4 is the label, split by the timestamp
        assert cfg.data.split == "column" and cfg.data.schema.label_threshold == 4 and cfg.data.negatives == 0
    else:  # implicit: sampled negatives for the user and item columns
        assert cfg.data.negatives == 2 and cfg.data.item_column == {"frappe": "item", "lastfm": "artistID"}[name]
