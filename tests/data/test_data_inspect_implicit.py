"""`tierec inspect` on logs without labels: it proposes sampled negatives for a user and an item column (named so,
or the first two id columns of a headerless file), leaves a count column out, finds item features; a file with a
label, or without a user and an item, keeps its label proposal."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from tierec.cli import main
from tierec.config import load_config
from tierec.data.inspect import inspect_file

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
TINY = ["train.batch_size=64", "embedding.dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]", "train.plots=false", "train.max_steps=5"]


def _log(path: Path, header: str = "customer_id,ProductId,plays,daytime,price_class\n", rows: int = 2000) -> Path:
    rng = np.random.default_rng(4)
    lines = [f"c{rng.integers(0, 150)},p{p},{rng.integers(1, 90)},{rng.choice(['am', 'pm', 'night'])},k{p % 4}"
             for p in rng.integers(0, 120, rows)]
    path.write_text(header + "\n".join(lines) + "\n")
    return path


def test_a_log_gets_negatives_for_its_user_and_item_and_trains(tmp_path: Path, capsys) -> None:
    path = _log(tmp_path / "purchases.csv")
    report = inspect_file(path)
    n = report.negatives
    assert n is not None and (n.user, n.item, n.item_features) == ("customer_id", "ProductId", ("price_class",))
    roles = {c.name: c.role for c in report.columns}
    assert roles == {"customer_id": "categorical", "ProductId": "categorical", "plays": "count", "daytime": "categorical",
                     "price_class": "categorical"}
    out = tmp_path / "schema.toml"
    assert main(["inspect", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "count (left out)" in printed and "sampled negatives" in printed
    text = out.read_text()
    data = tomllib.loads(text)["data"]
    assert (data["negatives"], data["user_column"], data["item_column"], data["item_features"]) == (2, "customer_id", "ProductId", ["price_class"])
    assert "plays" not in data["schema"]["dense"] + data["schema"]["categorical"] and "label" not in data["schema"]
    assert "negatives = 2  # no label column" in text and "#   plays: count, left out" in text  # explained
    assert load_config([str(out)]).data.negatives == 2
    argv = ["train", "--config", str(out), "--run-dir", str(tmp_path / "run"), "--no-progress", *[x for s in TINY for x in ("--set", s)]]
    assert main(argv) == 0


def test_headerless_logs_take_the_first_two_id_columns(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    path = tmp_path / "plays.tsv"
    path.write_text("".join(f"{rng.integers(1, 400)}\t{rng.integers(1, 3000)}\n" for _ in range(1500)))
    report = inspect_file(path)
    assert not report.header and report.negatives is not None and (report.negatives.user, report.negatives.item) == ("c0", "c1")
    assert "no header" in report.negatives.reason


def test_a_label_or_no_user_and_item_keeps_the_label_proposal(tmp_path: Path) -> None:
    rated = tmp_path / "rated.csv"
    rng = np.random.default_rng(6)
    rated.write_text("user,item,rating\n" + "".join(f"u{rng.integers(0, 50)},i{rng.integers(0, 80)},{rng.integers(1, 6)}\n" for _ in range(500)))
    report = inspect_file(rated)
    assert report.negatives is None and [c.name for c in report.column("label")] == ["rating"]
    counts = tmp_path / "counts.csv"
    counts.write_text("page,referrer,visits\n" + "".join(f"p{rng.integers(0, 50)},r{rng.integers(0, 9)},{rng.integers(1, 30)}\n" for _ in range(500)))
    report = inspect_file(counts)
    assert report.negatives is None and [c.name for c in report.column("label")] == ["visits"]  # as before: a count label


@pytest.mark.skipif(not (SHARED / "frappe" / "frappe.csv").exists(), reason="../shared/data/frappe is absent")
def test_frappe_and_lastfm_layouts(tmp_path: Path) -> None:
    frappe = inspect_file(SHARED / "frappe" / "frappe.csv")
    assert frappe.negatives is not None and (frappe.negatives.user, frappe.negatives.item, frappe.negatives.item_features) == ("user", "item", ("cost",))
    assert [c.name for c in frappe.columns if c.left_out] == ["cnt"]
    lastfm = SHARED / "lastfm-2k" / "user_artists.dat"
    if lastfm.exists():
        report = inspect_file(lastfm)
        n = report.negatives
        assert n is not None and (n.user, n.item, report.grouped_by) == ("userID", "artistID", "userID")
        assert [c.role for c in report.columns] == ["categorical", "categorical", "count"]
