"""Issue 25's table: the inspect-to-train path on the public files, beside tuned LR and item popularity.

For each file in ``../shared/data`` (skipped when absent) this does what a new user
does: ``tierec inspect FILE --out SCHEMA.toml``, then ``tierec train --config
SCHEMA.toml`` with nothing else set but the model and the seed (no hand edits: the
size-chosen defaults apply). On exactly the split that schema gives (the same rows,
hashed ids and sampled negatives the models saw: ``benchmarks.baselines.split_rows``)
it fits the two baselines:

* logistic regression, one-hot ids (and scaled dense columns), C tuned on 20% of
  the training rows held out by the schema's split rule (``benchmarks.baselines.tuning_split``:
  the latest by time for a time split, a hash bucket for a hash split, the last rows of a
  tail split; ``benchmarks.baselines.logistic_regression``) over a
  wider grid than its default (``CS``, 0.001-30: on the MovieLens part the default
  grid picked its top, 3, and on the Amazon head its bottom, 0.01);
* item popularity, two ways: the smoothed positive rate of the item's id in the
  training rows (``benchmarks.baselines.item_popularity``; the item column is
  ``data.item_column`` when inspect set one, else the file's item column below), and
  the item's number of training positives (``benchmarks.implicit``'s baseline, the
  natural one for implicit logs with sampled negatives). The table shows the higher.

Files (``--files``, comma-separated, default all):

==========  ===========================================================================
criteo      ``criteo/train_head10000.txt``: inspect recognises the Criteo layout (preset);
            the default tail split (its rows are in time order)
movielens   ``movielens-1m-part/ratings.dat``: ``::``-separated, headerless ratings;
            inspect proposes rating >= 4 as the label and a split on the timestamp
amazon      ``amazon-beauty/ratings_Beauty_head30k.csv``: trailing commas; rating >= 4,
            timestamp split (inspect leaves out the near-unique user id)
frappe      ``frappe/frappe.csv``: implicit, 2 sampled negatives per use (inspect's)
lastfm      ``lastfm-2k/user_artists.dat``: implicit play counts, CRLF, hash split and
            2 sampled negatives (inspect's)
==========  ===========================================================================

    python -m benchmarks.public_data --work /tmp/i25 --seeds 0,1,2 --json docs/bench/issue25_public/amazon.json \\
        --files amazon --host "..." --date 2026-11-27
    python -m benchmarks.public_data --table docs/bench/issue25_public/*.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.baselines import item_popularity, logistic_regression, split_rows, tuning_split
from tierec.config import load_config

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FILES = {  # name: (path, item column when inspect names none)
    "criteo": (SHARED / "criteo" / "train_head10000.txt", "C1"),
    "movielens": (SHARED / "movielens-1m-part" / "ratings.dat", "c1"),
    "amazon": (SHARED / "amazon-beauty" / "ratings_Beauty_head30k.csv", "ProductId"),
    "frappe": (SHARED / "frappe" / "frappe.csv", "item"),
    "lastfm": (SHARED / "lastfm-2k" / "user_artists.dat", "artistID"),
}
MODELS = ("dlrm", "deepfm", "dcnv2", "widedeep")
CS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)  # LR's C grid (baselines.py's: 0.01-3)
NAMES = {"dlrm": "DLRM", "deepfm": "DeepFM", "dcnv2": "DCN-v2", "widedeep": "Wide&Deep"}


def inspect(path: Path, out: Path) -> Path:
    """``tierec inspect PATH --out OUT``, through the CLI as a user runs it."""
    from tierec.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(["inspect", str(path), "--out", str(out)])
    if code != 0:
        raise SystemExit(f"tierec inspect {path} exited {code}")
    return out


def _no_values(schema_text: str) -> str:
    """The schema as inspect wrote it, without the example values its comments quote (rows of the shared
    files stay out of the repository)."""
    return re.sub(r"e\.g\. '[^']*'", "e.g. <a value of the file>", schema_text)


def train(schema: Path, model: str, seed: int, run_dir: Path) -> dict:
    """``tierec train --config SCHEMA`` with only the model and seed set; its summary."""
    from tierec.cli import main

    args = ["train", "--config", str(schema), "--run-dir", str(run_dir), "--overwrite", "--no-progress",
            "--set", f'model.name="{model}"', "--set", f"train.seed={seed}", "--set", "train.plots=false"]
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    if code != 0:
        raise SystemExit(f"tierec train {' '.join(args)} exited {code}")
    return json.loads((run_dir / "summary.json").read_text())


def baselines(schema: Path, item: str) -> dict:
    """LR and both item popularities on the schema's split."""
    from tierec.train.metrics import auc

    cfg = load_config([str(schema)], [])
    item = cfg.data.item_column or item
    tr, te = split_rows(cfg, "train"), split_rows(cfg, "test")
    column = tr[3].index(item)
    lr = logistic_regression(tr[:3], te[:3], cs=CS, tuning=tuning_split(cfg))
    rate = item_popularity(tr[:3], te[:3], column=column)
    (_, xi, y, _), (_, ti, ty, _) = tr, te
    keys, counts = np.unique(xi[y == 1, column], return_counts=True)
    lookup = dict(zip(keys.tolist(), counts.tolist()))
    count = auc(_t(np.array([lookup.get(k, 0) for k in ti[:, column].tolist()], np.float64)), _t(ty))
    return {"train_rows": int(len(y)), "test_rows": int(len(ty)), "test_positive_rate": float(ty.mean()),
            "features": list(tr[3]), "item_column": item, "logistic_regression_auc": lr["auc"], "logistic_regression_C": lr["C"],
            "popularity_rate_auc": rate, "popularity_count_auc": count, "item_popularity_auc": max(rate, count)}


def seen_items(name: str, work: Path, models: list[str], seed: int) -> dict:
    """AUCs on the test rows whose item has a training positive, beside all test rows.

    With sampled negatives drawn from training items only (before 2026-11-27), every test row whose
    item has no training positive was a positive: a score that ranks unknown items high (item popularity by
    rate gives them the base rate, LR's one-hot gives them no weight) gained from that; now those items are
    test negatives too, and this shows what is left of it. The models' scores
    come from the checkpoints of the runs already made in ``work``, on the same test rows (checked by their labels).
    """
    import torch

    from tierec.cli import _checkpoint_path, _restore
    from tierec.data import open_dataset
    from tierec.train.evaluate import _scores
    from tierec.train.metrics import auc

    path, item = FILES[name]
    schema = work / f"{name}.toml"
    cfg = load_config([str(schema)], [])
    item = cfg.data.item_column or item
    tr, te = split_rows(cfg, "train"), split_rows(cfg, "test")
    (_, xi, y, names), (_, ti, ty, _) = tr, te
    c = names.index(item)
    keep = np.isin(ti[:, c], np.unique(xi[y == 1, c]))
    sub = (te[0][keep], ti[keep], ty[keep])
    out = {"file": name, "item_column": item, "test_rows": int(ty.size), "test_rows_kept": int(keep.sum()),
           "dropped_positive_rate": float(ty[~keep].mean()) if (~keep).any() else None,
           "logistic_regression_auc_kept": logistic_regression(tr[:3], sub, cs=CS)["auc"],
           "popularity_rate_auc_kept": item_popularity(tr[:3], sub, column=c), "models": {}}
    keys, counts = np.unique(xi[y == 1, c], return_counts=True)
    lookup = dict(zip(keys.tolist(), counts.tolist()))
    out["popularity_count_auc_kept"] = auc(_t(np.array([lookup.get(k, 0) for k in ti[keep, c].tolist()], np.float64)), _t(ty[keep]))
    for model in models:
        cp, parts = _restore(_checkpoint_path(str(work / "runs" / f"{name}-{model}-{seed}"), False), None, [])
        pairs = list(_scores(cp, parts, open_dataset(cp.data).source("test", cp.train.batch_size)))
        s = torch.cat([p[0] for p in pairs]).double().numpy()
        lab = torch.cat([p[1] for p in pairs]).double().numpy()
        if not np.array_equal(lab, ty.astype(np.float64)):
            raise SystemExit(f"{model}: the checkpoint's test rows are not split_rows' (labels differ)")
        out["models"][model] = {"seed": seed, "auc_all": auc(_t(s), _t(lab)), "auc_kept": auc(_t(s[keep]), _t(lab[keep]))}
    return out


def _t(a: np.ndarray):
    import torch

    return torch.as_tensor(np.asarray(a, np.float64))


def verdict(mean: float, lr: float, pop: float) -> str:
    ok_lr, ok_pop = mean >= lr - 0.01, mean > pop
    return "meets" if ok_lr and ok_pop else "misses: " + ", ".join(
        w for w, bad in ((f"{lr - mean:.4f} below LR", not ok_lr), ("not above item popularity", not ok_pop)) if bad)


def markdown(paths: list[Path]) -> str:
    """One row per file: each model's mean test AUC over its seeds (gap to LR), LR, item popularity."""
    rows: dict[str, dict] = {}
    for path in paths:
        for r in json.loads(path.read_text())["results"]:
            rows.setdefault(r["file"], {**r["baselines"], "models": {}})["models"][r["model"]] = r
    out = ["| file (train / test rows) | DLRM | DeepFM | DCN-v2 | Wide&Deep | logistic regression | item popularity |",
           "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        cells = []
        for m in MODELS:
            x = r["models"].get(m)
            cells.append(f"{x['mean_test_auc']:.4f} ({x['mean_test_auc'] - r['logistic_regression_auc']:+.4f}, {len(x['runs'])})"
                         if x else "not run")
        out.append(f"| {name} ({r['train_rows']:,} / {r['test_rows']:,}) | " + " | ".join(cells)
                   + f" | {r['logistic_regression_auc']:.4f} | {r['item_popularity_auc']:.4f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.public_data", description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, help="directory for the schemas and runs (created)")
    p.add_argument("--table", nargs="+", type=Path, help="print these JSON results as a markdown table, and stop")
    p.add_argument("--files", default=",".join(FILES))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--json", type=Path, help="write the results here (rewritten after every model)")
    p.add_argument("--seen-items", action="store_true",
                   help="with --files and --work of a finished run: AUCs on the test rows whose item has a training positive")
    p.add_argument("--host", default="")
    p.add_argument("--date", default="")
    a = p.parse_args(argv)
    if a.table:
        print(markdown(a.table))
        return 0
    if a.work is None:
        p.error("--work is required (or --table)")
    a.work.mkdir(parents=True, exist_ok=True)
    if a.seen_items:
        res = [seen_items(n, a.work, a.models.split(","), int(a.seeds.split(",")[0])) for n in a.files.split(",")]
        print(json.dumps(res, indent=1))
        if a.json:
            a.json.write_text(json.dumps({"host": a.host, "date": a.date, "results": res}, indent=1) + "\n")
        return 0
    command = "python -m benchmarks.public_data " + " ".join(sys.argv[1:] if argv is None else argv)
    results = []
    for name in a.files.split(","):
        path, item = FILES[name]
        if not path.is_file():
            print(f"{name}: {path} is absent, skipped")
            continue
        schema = inspect(path, a.work / f"{name}.toml")
        base = baselines(schema, item)
        print(f"{name}: {base['train_rows']:,} / {base['test_rows']:,} rows, features {base['features']}; LR {base['logistic_regression_auc']:.4f} "
              f"(C={base['logistic_regression_C']}), popularity rate {base['popularity_rate_auc']:.4f} count {base['popularity_count_auc']:.4f}", flush=True)
        for model in a.models.split(","):
            runs = []
            for seed in (int(s) for s in a.seeds.split(",")):
                s = train(schema, model, seed, a.work / "runs" / f"{name}-{model}-{seed}")
                runs.append({"seed": seed, "test_auc": s["test_auc"], "steps": s["steps"]})
                print(f"  {model:9s} seed {seed}: {s['test_auc']:.4f}", flush=True)
            mean = statistics.fmean(r["test_auc"] for r in runs)
            v = verdict(mean, base["logistic_regression_auc"], base["item_popularity_auc"])
            results.append({"file": name, "source": str(path.relative_to(SHARED.parent.parent)), "model": model, "runs": runs,
                            "mean_test_auc": mean, "gap_to_lr": mean - base["logistic_regression_auc"], "verdict": v,
                            "schema": _no_values(schema.read_text()), "baselines": base})
            print(f"  {model:9s} mean {mean:.4f} gap {mean - base['logistic_regression_auc']:+.4f}: {v}", flush=True)
            if a.json:
                a.json.parent.mkdir(parents=True, exist_ok=True)
                a.json.write_text(json.dumps({"host": a.host, "date": a.date, "command": command, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
