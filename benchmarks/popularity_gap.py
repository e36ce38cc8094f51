"""Where item popularity beats the models on a file with one id feature (issue 25's Amazon Beauty head).

On the runs of a finished ``benchmarks.public_data`` work directory (its inspected
schema and the checkpoints of ``FILE-MODEL-SEED``), on exactly the test rows the
models scored, this reports:

* item popularity's variants: the item's positive rate in training smoothed by a
  prior of ``p`` rows at the base rate for several ``p`` (0 = the raw rate; 10 is
  ``benchmarks.baselines.item_popularity``'s), the item's count of training rows
  and of training positives (a frequency encoding, what a count feature would add);
* the test rows by their item's count of training rows (unseen, 1-9, 10-29, 30 and
  more): how many, their positive rate, and the AUC within each group of every
  model, of the raw rate and of the smoothed rate;
* each model's mean logit on test rows of unseen items and of seen items, and its
  AUC with the unseen items' rows put at the seen rows' mean logit.

    python -m benchmarks.popularity_gap --work /tmp/i25 --file amazon --seed 0 \\
        --json docs/bench/issue25_public/amazon_gap.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.baselines import split_rows
from benchmarks.public_data import FILES, MODELS
from tierec.config import load_config

PRIORS = (0.0, 1.0, 3.0, 10.0, 30.0, 100.0)
GROUPS = ((0, 0), (1, 9), (10, 29), (30, None))  # training rows of the item: low, high (None: no bound)


def _auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    import torch

    from tierec.train.metrics import auc

    if labels.min() == labels.max():
        return None
    return float(auc(torch.as_tensor(scores, dtype=torch.float64), torch.as_tensor(labels, dtype=torch.float64)))


def model_scores(run: Path) -> tuple[np.ndarray, np.ndarray]:
    """Test scores (logits) and labels of a run's checkpoint."""
    import torch

    from tierec.cli import _checkpoint_path, _restore
    from tierec.data import open_dataset
    from tierec.train.evaluate import _scores

    cp, parts = _restore(_checkpoint_path(str(run), False), None, [])
    pairs = list(_scores(cp, parts, open_dataset(cp.data).source("test", cp.train.batch_size)))
    return torch.cat([p[0] for p in pairs]).double().numpy(), torch.cat([p[1] for p in pairs]).double().numpy()


def gap(name: str, work: Path, seed: int, models: list[str]) -> dict:
    cfg = load_config([str(work / f"{name}.toml")], [])
    item = cfg.data.item_column or FILES[name][1]
    (_, xi, y, names), (_, ti, ty, _) = split_rows(cfg, "train"), split_rows(cfg, "test")
    c = names.index(item)
    keys, inverse, rows = np.unique(xi[:, c], return_inverse=True, return_counts=True)
    positives = np.bincount(inverse, weights=y, minlength=keys.size)
    at = np.searchsorted(keys, ti[:, c]).clip(max=keys.size - 1)
    seen = keys[at] == ti[:, c]
    n = np.where(seen, rows[at], 0)  # [test] the item's training rows
    pos = np.where(seen, positives[at], 0.0)
    base = float(y.mean())
    ty = ty.astype(np.float64)

    def rate(prior: float) -> np.ndarray:
        return np.where(seen, (pos + prior * base) / np.maximum(n + prior, 1e-12), base)

    out: dict = {"file": name, "item_column": item, "seed": seed, "test_rows": int(ty.size), "train_items": int(keys.size),
                 "smoothed_rate_auc": {f"{p:g}": _auc(rate(p), ty) for p in PRIORS},
                 "training_rows_auc": _auc(n.astype(np.float64), ty), "training_positives_auc": _auc(pos, ty),
                 "groups": [], "models": {}}
    scored = {m: model_scores(work / "runs" / f"{name}-{m}-{seed}") for m in models}
    for m, (_, lab) in scored.items():
        if not np.array_equal(lab, ty):
            raise SystemExit(f"{m}: the checkpoint's test rows are not split_rows' (labels differ)")
    for lo, hi in GROUPS:
        g = (n >= lo) & ((n <= hi) if hi is not None else True)
        row = {"training_rows": f"{lo}-{hi}" if hi is not None else f">={lo}", "test_rows": int(g.sum()),
               "positive_rate": float(ty[g].mean()) if g.any() else None,
               "raw_rate_auc": _auc(rate(0)[g], ty[g]) if g.any() else None,
               "smoothed_rate_auc": _auc(rate(10)[g], ty[g]) if g.any() else None,
               "models_auc": {m: _auc(s[g], ty[g]) if g.any() else None for m, (s, _) in scored.items()}}
        out["groups"].append(row)
    for m, (s, _) in scored.items():
        out["models"][m] = {"auc": _auc(s, ty), "mean_logit_unseen": float(s[~seen].mean()) if (~seen).any() else None,
                            "mean_logit_seen": float(s[seen].mean()),
                            # the unseen items' rows at the seen rows' mean logit (what the smoothed rate's base rate does)
                            "auc_unseen_at_seen_mean": _auc(np.where(seen, s, s[seen].mean()), ty)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.popularity_gap", description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="a benchmarks.public_data work directory with its runs")
    p.add_argument("--file", default="amazon", choices=list(FILES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--json", type=Path)
    p.add_argument("--host", default="")
    p.add_argument("--date", default="")
    a = p.parse_args(argv)
    res = gap(a.file, a.work, a.seed, a.models.split(","))
    text = json.dumps({"host": a.host, "date": a.date, "result": res}, indent=1)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
