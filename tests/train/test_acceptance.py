"""Acceptance runs: real Criteo rows and the synthetic default's planted model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierec.config import load_config
from tierec.train.trainer import Trainer

CRITEO = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "criteo" / "train_head10000.txt"

# 8,000 training rows are tiny for a CTR model: most ids are seen once. The model
# architectures are the defaults; the embedding optimizer (Adam, small init) and
# the training length are set for a data set this small.
SMALL_DATA = [
    "data.test_rows=2000",
    "train.batch_size=256",
    "train.epochs=2",
    "embedding.init_scale=0.01",
    "embedding.optimizer.kind=adam",
    "embedding.optimizer.lr=0.001",
    "train.progress=false",
]


@pytest.mark.skipif(not CRITEO.is_file(), reason="Criteo sample not present in ../shared/data")
@pytest.mark.parametrize("model", ["dlrm", "deepfm"])
def test_criteo_sample_auc(tmp_path: Path, model: str) -> None:
    cfg = load_config(None, [f"data.source={CRITEO}", f"model.name={model}", *SMALL_DATA])
    summary = Trainer(cfg, tmp_path).fit()
    assert summary["test_rows"] == 2000
    print(f"{model}: test AUC {summary['test_auc']:.4f}")
    assert summary["test_auc"] >= 0.72
