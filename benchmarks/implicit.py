"""Implicit feedback with sampled negatives: the models' defaults against item popularity, on the same split.

For each log (Frappe, Last.fm in ``../shared/data``; skipped when absent) the schema
is the one ``tierec inspect`` writes (``data.negatives = 2`` for its user and item
columns, the count column left out; Last.fm gets a hash split, its rows being sorted
by user), with ``data.negative_sampling`` set to each of ``--sampling``. Every model
trains with ``tierec train --config SCHEMA`` and nothing else but the model and seed
(the size-chosen defaults apply). Item popularity scores each test row (the same rows:
positives and their fixed negatives) by its item's count among the training
positives: with uniform negatives a popular item is a positive more often; with
negatives drawn by popularity it is not, by construction. User kNN is a reference
for what the (user, item) pairs alone tell: a test row scores the mean number of
training items its user shares with each training user of its item, the user itself
included (so an item the user already used scores high); of three normalisations by
the item's user count (powers 0, 1/2 and 1) tried on the Last.fm test split, the
best (1): an optimistic reference. It holds a users x items matrix: small logs only.

    python -m benchmarks.implicit --work /tmp/implicit --json docs/bench/implicit/implicit.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.baselines import split_rows
from tierec.config import load_config

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
LOGS = {"frappe": SHARED / "frappe" / "frappe.csv", "lastfm": SHARED / "lastfm-2k" / "user_artists.dat"}


def inspected(path: Path, out: Path) -> Path:
    """The schema ``tierec inspect`` writes for ``path``."""
    from tierec.data.inspect import inspect_file
    from tierec.data.inspect_toml import schema_toml

    out.write_text(schema_toml(inspect_file(path)))
    return out


def train(schema: Path, over: list[str], run_dir: Path) -> dict:
    from tierec.cli import main

    args = ["train", "--config", str(schema), "--run-dir", str(run_dir), "--overwrite", "--no-progress"]
    for o in [*over, "train.plots=false"]:
        args += ["--set", o]
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    if code != 0:
        raise SystemExit(f"tierec train {' '.join(args)} exited {code}")
    return {**json.loads((run_dir / "summary.json").read_text()), "seconds": time.perf_counter() - t0}


def baselines(schema: Path, over: list[str]) -> dict[str, float | int]:
    """Test AUC of item popularity and user kNN (see above); train and test rows (with their negatives)."""
    import torch

    from tierec.train.metrics import auc

    cfg = load_config([str(schema)], over)
    (_, xi, y, names), (_, ti, ty, _) = split_rows(cfg, "train"), split_rows(cfg, "test")
    user, item = names.index(cfg.data.user_column), names.index(cfg.data.item_column)
    pos = xi[y == 1]
    users, u = np.unique(np.concatenate([pos[:, user], ti[:, user]]), return_inverse=True)
    items, i = np.unique(np.concatenate([pos[:, item], ti[:, item]]), return_inverse=True)
    n = pos.shape[0]
    used = np.zeros((users.size, items.size), np.float32)  # [users, items] training positives
    used[u[:n], i[:n]] = 1
    counts = used.sum(0)  # [items]
    shared = used @ used.T  # [users, users] items in common (the diagonal: a user's own items, for repeated uses)
    knn = (shared @ used)[u[n:], i[n:]] / np.maximum(counts[i[n:]], 1)
    rows = np.bincount(i[:n], minlength=items.size)  # [items] training positives (rows)
    labels = torch.as_tensor(ty.astype(np.float64))
    return {"item_popularity_auc": auc(torch.as_tensor(rows[i[n:]].astype(np.float64)), labels),
            "user_knn_auc": auc(torch.as_tensor(knn.astype(np.float64)), labels), "train_rows": int(y.size), "test_rows": int(ty.size)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.implicit", description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="directory for the schemas and runs (created)")
    p.add_argument("--logs", default=",".join(LOGS))
    p.add_argument("--models", default="dlrm,deepfm")
    p.add_argument("--sampling", default="uniform,popularity")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--host", default="", help="the machine, for the JSON")
    p.add_argument("--date", default="", help="the date, for the JSON")
    a = p.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    results = []
    print(f"{'log':8s} {'sampling':10s} {'model':8s} {'test AUC':>9s} {'popularity':>10s} {'user kNN':>9s} {'seconds':>8s}")
    for name in a.logs.split(","):
        if not LOGS[name].is_file():
            print(f"{name}: {LOGS[name]} is absent, skipped")
            continue
        schema = inspected(LOGS[name], a.work / f"{name}.toml")
        for sampling in a.sampling.split(","):
            over = [f'data.negative_sampling="{sampling}"']
            base = baselines(schema, over)
            for model in a.models.split(","):
                s = train(schema, [*over, f'model.name="{model}"', f"train.seed={a.seed}"], a.work / f"{name}-{sampling}-{model}")
                results.append({"log": name, "sampling": sampling, "model": model, "seed": a.seed, "test_auc": s["test_auc"], **base,
                                "steps": s["steps"], "seconds": round(s["seconds"], 1), "samples_per_s": s.get("train_samples_per_s")})
                print(f"{name:8s} {sampling:10s} {model:8s} {s['test_auc']:9.4f} {base['item_popularity_auc']:10.4f} "
                      f"{base['user_knn_auc']:9.4f} {s['seconds']:8.1f}", flush=True)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        command = "python -m benchmarks.implicit " + " ".join(sys.argv[1:] if argv is None else argv)
        a.json.write_text(json.dumps({"host": a.host, "date": a.date, "command": command, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
