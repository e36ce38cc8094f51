"""Baselines on exactly tierec's split: a tuned logistic regression and item popularity.

The rows come from :func:`tierec.data.open_source` with the run's data config, so
the train and test rows, the hashing of categorical values and the dense
transform are the ones the models saw. Logistic regression (scikit-learn, the
``dev`` extra) sees every categorical id one-hot and the dense features scaled;
its inverse regularisation ``C`` is tuned on a hold-out of 20% of the training
rows chosen by the run's own split rule (:func:`tuning_split`: the last rows of a
``tail`` split, the latest by the split column, a hash bucket of a ``hash``
split), then refit on all of them. Item popularity scores a test row by the smoothed
click rate of its ``--item`` column's id in the training rows.

    python -m benchmarks.baselines --set data.source=../shared/data/criteo/train_head10000.txt \\
        --set data.test_rows=2000 --item C1
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from tierec.config import load_config
from tierec.data import open_source
from tierec.train.metrics import auc


def split_rows(cfg, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """dense [n, d], ids [n, F] (one per feature; a bag's first id), labels [n]."""
    src = open_source(cfg.data, split, 65536)
    dense, ids, labels = [], [], []
    for b in src:
        sp = b.sparse
        f, n = len(sp.keys), b.size
        starts = sp.offsets[:-1].view(f, n)
        lengths = (sp.offsets[1:] - sp.offsets[:-1]).view(f, n)
        first = sp.values[starts.clamp(max=max(len(sp.values) - 1, 0))] if len(sp.values) else starts
        ids.append(np.where(lengths.numpy() > 0, first.numpy(), -1).T)
        dense.append(b.dense.numpy())
        labels.append(b.labels.numpy())
    return np.concatenate(dense), np.concatenate(ids), np.concatenate(labels), src.feature_names


def tuning_split(cfg, share: float = 0.2) -> tuple | None:
    """(fit rows, hold-out rows) for tuning C: ``share`` of the training rows held out by the config's own
    validation rule (data.validation_fraction), so that a file sorted by something else than its split
    (a time split of a file sorted by item) holds out what a later test looks like; None for a ``tail``
    split or a config that has a validation split already (the last rows of the training split are it)."""
    import dataclasses

    d = cfg.data
    if d.split == "tail" or d.validation_rows or d.validation_fraction or d.test_source or d.source == "synthetic":
        return None
    n_train, n_test = open_source(d, "train", 65536).num_rows, open_source(d, "test", 65536).num_rows
    if not n_train or n_test is None:
        return None
    tuned = dataclasses.replace(cfg, data=dataclasses.replace(d, validation_fraction=share * n_train / (n_train + n_test)))
    return split_rows(tuned, "train")[:3], split_rows(tuned, "validation")[:3]


def logistic_regression(train, test, cs=(0.01, 0.03, 0.1, 0.3, 1.0, 3.0), tuning=None) -> dict[str, float]:
    """Test AUC of one-hot logistic regression with C tuned on ``tuning`` (fit rows, hold-out rows:
    :func:`tuning_split`) or, without it, on the training rows' last 20%; refit on all training rows."""
    from scipy import sparse
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    (xd, xi, y), (td, ti, ty) = train, test
    enc = OneHotEncoder(handle_unknown="ignore", min_frequency=1)
    scale = StandardScaler()

    def fit(d, i, labels, c):
        parts = [enc.fit_transform(i)] + ([sparse.csr_matrix(scale.fit_transform(d))] if d.shape[1] else [])
        return LogisticRegression(C=c, max_iter=2000).fit(sparse.hstack(parts).tocsr(), labels)

    def score(model, d, i):
        parts = [enc.transform(i)] + ([sparse.csr_matrix(scale.transform(d))] if d.shape[1] else [])
        return model.predict_proba(sparse.hstack(parts).tocsr())[:, 1]

    if tuning is None:
        cut = int(len(y) * 0.8)
        tuning = ((xd[:cut], xi[:cut], y[:cut]), (xd[cut:], xi[cut:], y[cut:]))
    (fd, fi, fy), (vd, vi, vy) = tuning
    tuned = {}
    for c in cs:
        m = fit(fd, fi, fy, c)
        tuned[c] = auc(_t(score(m, vd, vi)), _t(vy))
    best_c = max(tuned, key=lambda c: tuned[c])
    m = fit(xd, xi, y, best_c)
    return {"auc": auc(_t(score(m, td, ti)), _t(ty)), "C": best_c}


def item_popularity(train, test, column: int, prior: float = 10.0) -> float:
    """Test AUC of the smoothed training click rate of each test row's item id."""
    (_, xi, y), (_, ti, ty) = train, test
    base = float(y.mean())
    keys, inverse = np.unique(xi[:, column], return_inverse=True)
    clicks = np.bincount(inverse, weights=y, minlength=len(keys))
    shown = np.bincount(inverse, minlength=len(keys))
    rate = dict(zip(keys.tolist(), ((clicks + prior * base) / (shown + prior)).tolist()))
    scores = np.array([rate.get(k, base) for k in ti[:, column].tolist()])
    return auc(_t(scores), _t(ty))


def _t(a: np.ndarray):
    import torch

    return torch.as_tensor(np.asarray(a, np.float64))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.baselines", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", action="append", default=[], metavar="FILE")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--item", default="", help="categorical column for item popularity (default: the first one)")
    a = p.parse_args(argv)
    cfg = load_config(a.config, a.overrides)
    train, test = split_rows(cfg, "train"), split_rows(cfg, "test")
    names = train[3]
    column = names.index(a.item) if a.item else 0
    lr = logistic_regression(train[:3], test[:3], tuning=tuning_split(cfg))
    out = {
        "train_rows": int(len(train[2])),
        "test_rows": int(len(test[2])),
        "logistic_regression_auc": lr["auc"],
        "logistic_regression_C": lr["C"],
        f"popularity_of_{names[column]}_auc": item_popularity(train[:3], test[:3], column),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
