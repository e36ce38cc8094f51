"""Implicit feedback end to end: `tierec train` with `data.negatives` on a log of uses made here (and on the
Frappe file when ../shared/data has it) learns who uses what; `tierec eval` scores the same fixed test rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tierec.cli import main

FRAPPE = Path(__file__).resolve().parents[3] / "shared" / "data" / "frappe" / "frappe.csv"


def _sets(items: list[str]) -> list[str]:
    return [x for o in items for x in ("--set", o)]


def _write_log(path: Path, rows: int = 5000, users: int = 200, items: int = 90, seed: int = 0) -> None:
    """Each user uses items of one of three groups 80% of the time, popular ones more (Zipf); no label column."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, users, rows)
    zipf = 1.0 / np.arange(1, items // 3 + 1)
    group_items = (u % 3) * (items // 3) + rng.choice(items // 3, rows, p=zipf / zipf.sum())
    i = np.where(rng.random(rows) < 0.8, group_items, rng.integers(0, items, rows))
    path.write_text("user_id,song\n" + "".join(f"u{a},s{b}\n" for a, b in zip(u, i)))


def test_train_on_a_log_of_uses_with_sampled_negatives(tmp_path: Path, capsys) -> None:
    log = tmp_path / "plays.csv"
    _write_log(log)
    run = tmp_path / "run"
    data = [f"data.source={json.dumps(str(log))}", 'data.schema.categorical=["user_id","song"]', "data.negatives=2",
            'data.user_column="user_id"', 'data.item_column="song"', "train.plots=false"]
    assert main(["train", "--run-dir", str(run), "--no-progress", *_sets(data)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    # 500 test positives and 1,000 negatives drawn uniformly: popular items are positives more often (0.697 measured;
    # item popularity alone 0.697: at this size and with the size-chosen defaults the model learns the items' biases)
    assert summary["test_auc"] > 0.65, summary
    capsys.readouterr()
    assert main(["eval", str(run / "checkpoints")]) == 0  # another process draws the same test negatives
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["rows"] == 1500 and result["positive_rate"] == pytest.approx(1 / 3)
    assert result["auc"] == pytest.approx(summary["test_auc"], abs=1e-9)


@pytest.mark.skipif(not FRAPPE.exists(), reason="../shared/data/frappe is absent")
def test_train_on_frappe_with_sampled_negatives(tmp_path: Path) -> None:
    run = tmp_path / "frappe"
    context = ["daytime", "weekday", "isweekend", "homework", "cost", "weather", "country", "city"]
    data = [f"data.source={json.dumps(str(FRAPPE))}", 'data.format="tsv"', f"data.schema.categorical={json.dumps(['user', 'item', *context])}",
            "data.negatives=2", 'data.user_column="user"', 'data.item_column="item"', 'data.item_features=["cost"]',
            "train.plots=false"]
    assert main(["train", "--run-dir", str(run), "--no-progress", *_sets(data)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["test_auc"] > 0.9, summary  # DLRM, the last 10% of rows as test: 0.971 with one epoch (2026-11-26)
