"""Metrics against scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

from tierec.train.metrics import EvalAccumulator, auc, logloss


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_sklearn_continuous(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    labels = (torch.rand(1000, generator=g) < 0.3).float()
    scores = torch.randn(1000, generator=g) + labels
    assert auc(scores, labels) == pytest.approx(roc_auc_score(labels.numpy(), scores.numpy()), abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_sklearn_with_heavy_ties(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    labels = (torch.rand(2000, generator=g) < 0.4).float()
    scores = torch.randint(0, 7, (2000,), generator=g).float() + labels * (torch.rand(2000, generator=g) < 0.5)
    assert auc(scores, labels) == pytest.approx(roc_auc_score(labels.numpy(), scores.numpy()), abs=1e-12)


def test_auc_small_cases() -> None:
    assert auc(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0, 1, 1])) == 0.5  # all tied
    assert auc(torch.tensor([0.0, 1.0]), torch.tensor([0, 1])) == 1.0
    assert auc(torch.tensor([1.0, 0.0]), torch.tensor([0, 1])) == 0.0
    assert auc(torch.tensor([[0.2], [0.9]]), torch.tensor([0.0, 1.0])) == 1.0  # any shape, same numel


def test_auc_degenerate_is_nan() -> None:
    assert math.isnan(auc(torch.rand(10), torch.ones(10)))
    assert math.isnan(auc(torch.rand(10), torch.zeros(10)))
    assert math.isnan(auc(torch.empty(0), torch.empty(0)))
    assert math.isnan(auc(torch.tensor([0.1, float("nan")]), torch.tensor([0, 1])))


def test_auc_length_mismatch() -> None:
    with pytest.raises(ValueError, match="labels has"):
        auc(torch.rand(3), torch.rand(4))


def test_logloss_matches_sklearn() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(500, generator=g) * 3
    labels = (torch.rand(500, generator=g) < 0.5).float()
    probs = torch.sigmoid(logits.double()).numpy()
    assert logloss(logits, labels) == pytest.approx(log_loss(labels.numpy(), probs, labels=[0, 1]), rel=1e-9)


def test_logloss_is_stable_for_huge_logits() -> None:
    logits = torch.tensor([1000.0, -1000.0, 1000.0])
    labels = torch.tensor([1.0, 0.0, 0.0])
    assert logloss(logits, labels) == pytest.approx(1000.0 / 3)
    assert math.isnan(logloss(torch.empty(0), torch.empty(0)))


def test_accumulator_matches_whole_array() -> None:
    g = torch.Generator().manual_seed(3)
    labels = (torch.rand(1234, generator=g) < 0.25).float()
    logits = torch.randn(1234, generator=g) + 2 * labels
    acc = EvalAccumulator()
    for start in range(0, 1234, 100):
        acc.update(logits[start : start + 100], labels[start : start + 100])
    r = acc.compute()
    y = labels.numpy()
    assert r["rows"] == len(acc) == 1234
    assert r["auc"] == pytest.approx(roc_auc_score(y, logits.numpy()), abs=1e-12)
    p = torch.sigmoid(logits.double()).numpy()
    assert r["logloss"] == pytest.approx(log_loss(y, p), rel=1e-9)
    assert r["positive_rate"] == pytest.approx(float(np.mean(y)))
    acc.reset()
    empty = acc.compute()
    assert empty["rows"] == 0 and math.isnan(empty["auc"]) and math.isnan(empty["positive_rate"])
