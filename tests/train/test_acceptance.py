"""Acceptance runs: real Criteo rows and the synthetic default's planted model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierec.config import given_keys, load_config
from tierec.train.sizing import size_defaults
from tierec.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
CRITEO = REPO.parent / "shared" / "data" / "criteo" / "train_head10000.txt"
# 8,000 training rows are tiny for a CTR model: most ids are seen once. The model
# architectures are the defaults; the batch, the epochs and the embedding optimizer are
# chosen from the data's size (as `tierec train` does); the shipped small-data file keeps
# the rows in time order.
SMALL_DATA = REPO / "configs" / "small_data.toml"


@pytest.mark.skipif(not CRITEO.is_file(), reason="Criteo sample not present in ../shared/data")
@pytest.mark.parametrize("model", ["dlrm", "deepfm"])
def test_criteo_sample_auc(tmp_path: Path, model: str) -> None:
    over = [f"data.source={CRITEO}", "data.test_rows=2000", f"model.name={model}", "train.progress=false"]
    cfg, chosen = size_defaults(load_config(SMALL_DATA, over), given_keys(SMALL_DATA, over))
    assert chosen["train.batch_size"] == 256
    summary = Trainer(cfg, tmp_path).fit()
    assert summary["test_rows"] == 2000
    print(f"{model}: test AUC {summary['test_auc']:.4f}")
    assert summary["test_auc"] >= 0.72


@pytest.mark.parametrize("model", ["dlrm", "deepfm", "dcnv2", "widedeep"])
def test_synthetic_default_near_planted_auc(tmp_path: Path, model: str) -> None:
    """The full synthetic default (1M training rows, one epoch): within 0.02 of the planted model's AUC."""
    cfg = load_config(None, [f"model.name={model}", "train.progress=false"])
    summary = Trainer(cfg, tmp_path).fit()
    print(f"{model}: test AUC {summary['test_auc']:.4f}, planted {summary['planted_auc']:.4f}")
    assert summary["test_rows"] == cfg.data.synthetic.test_rows
    assert summary["test_auc"] >= summary["planted_auc"] - 0.02
