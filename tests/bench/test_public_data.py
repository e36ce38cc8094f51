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


def test_lr_tunes_c_on_the_split_rules_hold_out(tmp_path: Path) -> None:
    """A time split of a file sorted by item: C is tuned on the latest training rows by time (not the file's
    last rows), the rows refit on are the training split's, and a tail split keeps its last rows."""
    import numpy as np

    from benchmarks.baselines import split_rows, tuning_split

    rng = np.random.default_rng(0)
    n = 2000
    items, times = np.sort(rng.integers(0, 40, n)), rng.permutation(n)  # sorted by item, time shuffled
    path = tmp_path / "log.csv"
    path.write_text("y,item,t\n" + "".join(f"{int(rng.random() < 0.4)},i{i},{t}\n" for i, t in zip(items, times)))
    over = [f"data.source={path}", 'data.schema.label="y"', 'data.schema.categorical=["item"]', 'data.schema.dense=["t"]',
            'data.split="column"', 'data.split_column="t"', "data.test_fraction=0.2"]
    cfg = load_config(None, over)
    fit, hold = tuning_split(cfg)
    train = split_rows(cfg, "train")
    assert len(fit[2]) + len(hold[2]) == len(train[2]) == 1600 and abs(len(hold[2]) - 320) <= 2
    assert fit[0][:, 0].max() < hold[0][:, 0].min()  # the hold-out is the latest by time (the raw t column)
    assert tuning_split(load_config(None, over[:-3] + ['data.split="tail"'])) is None


@pytest.mark.parametrize("name", ["criteo", "movielens", "amazon", "frappe", "lastfm"])
def test_the_hand_written_schema_asks_the_inspected_schemas_task(name: str, tmp_path: Path) -> None:
    """benchmarks.hand_schema compares column roles only: the hand-written schema has the inspected one's label,
    threshold, split and negatives, and every column it names is one the file has."""
    from benchmarks.hand_schema import HAND
    from tierec.data import open_source

    path, _ = public_data.FILES[name]
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    auto = load_config([str(public_data.inspect(path, tmp_path / "a.toml"))], [])
    (tmp_path / "h.toml").write_text(HAND[name].format(source=path))
    hand = load_config([str(tmp_path / "h.toml")], [])
    for key in ("split", "negatives", "negative_sampling"):
        assert getattr(hand.data, key) == getattr(auto.data, key), key
    assert str(hand.data.schema.label_threshold) == str(auto.data.schema.label_threshold)  # (nan: none)
    assert len(hand.data.schema.categorical) >= len(auto.data.schema.categorical)
    batch = next(iter(open_source(hand.data, "train", 256)))  # the file reads with the hand-written columns
    assert batch.size == 256
