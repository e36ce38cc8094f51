"""Acceptance runs: real Criteo rows and the synthetic default's planted model."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.baselines import logistic_regression, split_rows
from tierec.config import given_keys, load_config
from tierec.train.sizing import size_defaults
from tierec.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
CRITEO = REPO.parent / "shared" / "data" / "criteo" / "train_head10000.txt"
OVER = [f"data.source={CRITEO}", "data.test_rows=2000", "train.progress=false", "train.plots=false"]


@pytest.fixture(scope="module")
def logistic_regression_auc() -> float:
    """A one-hot logistic regression with its C tuned, on exactly the models' split (0.7367 on this file)."""
    cfg = load_config(None, OVER)
    return logistic_regression(split_rows(cfg, "train")[:3], split_rows(cfg, "test")[:3])["auc"]


@pytest.mark.skipif(not CRITEO.is_file(), reason="Criteo sample not present in ../shared/data")
@pytest.mark.parametrize("model", ["dlrm", "deepfm", "dcnv2", "widedeep"])
def test_criteo_sample_defaults_near_logistic_regression(tmp_path: Path, model: str, logistic_regression_auc: float) -> None:
    """8,000 training rows, most ids seen once, with only the file given: the size-chosen defaults (as
    `tierec train` applies them) come near a tuned logistic regression. docs/models.md gives the means over
    three seeds (within 0.01 of it); one seed is checked here, with room for a seed's spread (about 0.005)."""
    over = [*OVER, f"model.name={model}"]
    cfg, chosen = size_defaults(load_config(None, over), given_keys([], over))
    assert chosen["train.batch_size"] == 256 and chosen["embedding.dim"] == 8
    summary = Trainer(cfg, tmp_path).fit()
    assert summary["test_rows"] == 2000
    print(f"{model}: test AUC {summary['test_auc']:.4f}, logistic regression {logistic_regression_auc:.4f}")
    # Before the size-chosen dim, dense lr and first-order terms, DLRM scored 0.7117 and DCN-v2 0.7211 here.
    assert summary["test_auc"] >= logistic_regression_auc - 0.015


@pytest.mark.parametrize("model", ["dlrm", *(pytest.param(m, marks=pytest.mark.slow) for m in ("deepfm", "dcnv2", "widedeep"))])
def test_synthetic_default_near_planted_auc(tmp_path: Path, model: str) -> None:
    """The full synthetic default (1M training rows, one epoch): within 0.02 of the planted model's AUC; DCN-v2 on
    500,000 rows (its full-rank cross layers in fp32: 34-58 s there on a 2-core AVX2 host, 0.016 below). `make test`
    runs DLRM, the default model; the other three (marked slow: 2-2.5 min on that host) run with `make test-slow`,
    and the Criteo-sample test above checks each of them on every `make test`."""
    rows = ["data.synthetic.train_rows=500000"] if model == "dcnv2" else []
    cfg = load_config(None, [f"model.name={model}", "train.progress=false", *rows])
    summary = Trainer(cfg, tmp_path).fit()
    print(f"{model}: test AUC {summary['test_auc']:.4f}, planted {summary['planted_auc']:.4f}")
    assert summary["test_rows"] == cfg.data.synthetic.test_rows
    assert summary["test_auc"] >= summary["planted_auc"] - 0.02
