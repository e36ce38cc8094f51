"""Label thresholds: any number is one (0 and negatives included); unset (nan) means labels are 0/1;
a config tierec wrote before thresholds could be 0 still means what it meant."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from tierec.config import ConfigError, load_config, to_dict, upgrade_saved
from tierec.data import DataError, open_source
from tierec.train.rundir import resume_config


def _labels(tmp_path: Path, values: list[str], threshold: str | None) -> np.ndarray:
    f = tmp_path / "r.csv"
    f.write_text("rating,user\n" + "".join(f"{v},u{i}\n" for i, v in enumerate(values)))
    over = [f"data.source={f}", "data.schema.label=\"rating\"", "data.schema.categorical=[\"user\"]", "data.test_rows=1"]
    if threshold is not None:
        over.append(f"data.schema.label_threshold={threshold}")
    src = open_source(load_config(None, over).data, "all", 64)
    return np.concatenate([b.labels.numpy() for b in src])


def test_a_threshold_of_zero_and_a_negative_one(tmp_path: Path) -> None:
    ratings = ["-10", "-0.5", "0", "3.5", "10"]
    assert _labels(tmp_path, ratings, "0").tolist() == [0, 0, 1, 1, 1]
    assert _labels(tmp_path, ratings, "-1").tolist() == [0, 1, 1, 1, 1]


def test_without_a_threshold_labels_must_be_0_or_1(tmp_path: Path) -> None:
    assert _labels(tmp_path, ["0", "1", "0.25"], None).tolist() == [0, 1, 0.25]
    with pytest.raises(DataError, match="label_threshold"):
        _labels(tmp_path, ["0", "4"], None)


def test_the_default_is_unset_and_written_as_nan() -> None:
    cfg = load_config(None)
    assert math.isnan(cfg.data.schema.label_threshold)
    with pytest.raises(ConfigError, match="format"):
        load_config(None, ["format=1"])


def test_a_run_written_before_format_2_keeps_its_meaning(tmp_path: Path) -> None:
    """Format 1 wrote label_threshold = 0 for "no threshold": resuming such a run must not make every label 1."""
    run = tmp_path / "run"
    run.mkdir()
    saved = upgrade_saved({})  # today's keys ...
    old = {k: v for k, v in tomllib.loads(tomli_w.dumps(to_dict(load_config(None)))).items() if k != "format"}
    old["data"]["schema"]["label_threshold"] = 0.0  # ... as format 1 wrote them
    (run / "config.toml").write_text(tomli_w.dumps(old))
    (run / ".tierec-run").write_text("")
    cfg = resume_config(run, None, [])
    assert saved["format"] == 2 and cfg is not None and math.isnan(cfg.data.schema.label_threshold)
    # a threshold other than 0 in an old run is kept
    old["data"]["schema"]["label_threshold"] = 4.0
    (run / "config.toml").write_text(tomli_w.dumps(old))
    assert resume_config(run, None, []).data.schema.label_threshold == 4.0



def test_an_old_config_file_with_threshold_0_is_refused_not_misread(tmp_path: Path) -> None:
    """A run's config.toml from before format 2, passed with --config: 0 meant "no threshold" there."""
    old = to_dict(load_config(None))
    del old["format"]
    old["data"]["schema"]["label_threshold"] = 0.0
    f = tmp_path / "old.toml"
    f.write_text(tomli_w.dumps(old))
    with pytest.raises(ConfigError, match="label_threshold = 0 in a config without `format`"):
        load_config(str(f))
    (tmp_path / "new.toml").write_text("format = 2\n" + tomli_w.dumps(old))
    assert load_config(str(tmp_path / "new.toml")).data.schema.label_threshold == 0.0
    assert load_config(None, ["data.schema.label_threshold=0"]).data.schema.label_threshold == 0.0
