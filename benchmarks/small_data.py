"""The shipped defaults on small files, beside a tuned logistic regression and item popularity.

Issue 16's target: with only the schema given, every model comes within 0.01 test
AUC of a logistic regression with its C tuned, on files of 5,000-100,000 rows
(more up to 204,800), on the same split. This writes a set of small files into
``--work`` (none is part of the repository), trains every model on each with
``tierec train`` as a user would (the size-chosen defaults apply) for several
seeds, runs ``benchmarks.baselines`` on the same split, and prints one row per
file and model: mean test AUC over the seeds, the logistic regression's, the gap,
and item popularity's.

Files (``--files``, comma-separated, default all):

==========  =================================================================================
s200        ``../shared/data/criteo/sample200_with_header.csv`` with the schema ``tierec inspect``
            writes (180 / 20 rows: its AUCs are noise; it shows the path from inspect to train)
crit        ``../shared/data/criteo/train_head10000.txt``, last 2,000 rows test (time order)
crith       the same file split by a hash of the row number, 20% test
crit5k      its first 5,000 rows, last 1,000 test
critcat     its label and 26 categorical columns only (no numeric ones), last 2,000 test
syn12k      12,000 rows of tierec's Criteo-shaped synthetic data (planted model, seed 8),
            written as a Criteo TSV, last 2,000 test
syn50k      the same, 50,000 rows (seed 7), last 10,000 test
syn180k     the same, 180,000 rows (seed 11), last 20,000 test
syncat50k   50,000 synthetic rows without numeric columns (seed 9), CSV, last 10,000 test
ids2h       ``tierec.data.id_only``: 20,000 rows, 1,000 users, 300 items (seed 1), hash split
t30h        30,000 rows, 800 users, 200 items (seed 3), hash split
idsh        60,000 rows, 2,000 users, 500 items (seed 0), hash split
idst        the same file, tail split (it is sorted by user: test users are unseen)
ids3h       100,000 rows, 5,000 users, 2,000 items (seed 2), hash split
==========  =================================================================================

    python -m benchmarks.small_data --work /tmp/small --seeds 0,1,2 --json docs/bench/small_data.json
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.baselines import item_popularity, logistic_regression, split_rows
from tierec.config import load_config

REPO = Path(__file__).resolve().parents[1]
CRITEO = REPO.parent / "shared" / "data" / "criteo" / "train_head10000.txt"
MODELS = ("dlrm", "deepfm", "dcnv2", "widedeep")
CATS = [f"c{i}" for i in range(1, 27)]
_CAT_SCHEMA = ['data.schema.label="label"', f"data.schema.categorical={json.dumps(CATS)}", "data.schema.dense=[]"]
_ID_SCHEMA = ['data.schema.label="clicked"', 'data.schema.categorical=["user","item"]', "data.schema.dense=[]"]


def _synthetic(path: Path, rows: int, seed: int, dense: bool) -> None:
    """``rows`` rows of the synthetic generator: a Criteo TSV (with dense) or a CSV of categorical columns."""
    over = [f"data.synthetic.train_rows={rows}", "data.synthetic.test_rows=1", f"data.synthetic.seed={seed}",
            "data.synthetic.zipf=1.1", f"data.synthetic.n_dense={13 if dense else 0}"]
    d, ids, y, _ = split_rows(load_config(None, over), "train")
    hexed = np.vectorize(lambda v: format(int(v) & 0xFFFFFFFF, "08x"))(ids)  # the low 32 bits: Criteo's hex ids
    with path.open("w", newline="") as f:
        if dense:
            for k in range(len(y)):
                f.write("\t".join([str(int(y[k])), *(f"{v:.4f}" for v in d[k]), *hexed[k]]) + "\n")
        else:
            w = csv.writer(f)
            w.writerow(["label", *CATS])
            for k in range(len(y)):
                w.writerow([int(y[k]), *hexed[k]])


def _criteo_categorical(path: Path) -> None:
    with CRITEO.open() as src, path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", *CATS])
        for line in src:
            parts = line.rstrip("\n").split("\t")
            w.writerow([parts[0], *parts[14:40]])


def _inspected(path: Path) -> None:
    """The schema ``tierec inspect`` writes for the 200-row CSV sample (its own data.source)."""
    from tierec.data.inspect import inspect_file
    from tierec.data.inspect_toml import schema_toml

    path.write_text(schema_toml(inspect_file(CRITEO.with_name("sample200_with_header.csv"))))


def _id_only(path: Path, rows: int, users: int, items: int, seed: int) -> None:
    from tierec.data.id_only import write_id_only

    write_id_only(path, rows=rows, users=users, items=items, seed=seed)


@dataclass(frozen=True)
class SmallFile:
    over: list[str]  # the --set overrides: source, split, schema
    item: str  # the column for item popularity
    make: Callable[[Path], None] | None = None  # writes the file at ``path`` (None: an existing file)
    path: Path | None = None
    config: Path | None = None  # a --config file (written by ``make``)


def files(work: Path) -> dict[str, SmallFile]:
    def made(name: str, over: list[str], item: str, make: Callable[[Path], None]) -> SmallFile:
        path = work / name
        return SmallFile([f"data.source={json.dumps(str(path))}", *over], item, make, path)

    crit = f"data.source={json.dumps(str(CRITEO))}"
    s200 = work / "s200.toml"
    return {
        "s200": SmallFile([], "C1", _inspected, s200, s200),
        "crit": SmallFile([crit, "data.test_rows=2000"], "C1"),
        "crith": SmallFile([crit, "data.test_fraction=0.2", 'data.split="hash"'], "C1"),
        "crit5k": made("crit5k.txt", ["data.test_rows=1000"], "C1", lambda p: p.write_text("".join(CRITEO.open().readlines()[:5000]))),
        "critcat": made("critcat.csv", ["data.test_rows=2000", *_CAT_SCHEMA], "c1", _criteo_categorical),
        "syn12k": made("syn12k.txt", ["data.test_rows=2000"], "C1", lambda p: _synthetic(p, 12_000, 8, True)),
        "syn50k": made("syn50k.txt", ["data.test_rows=10000"], "C1", lambda p: _synthetic(p, 50_000, 7, True)),
        "syn180k": made("syn180k.txt", ["data.test_rows=20000"], "C1", lambda p: _synthetic(p, 180_000, 11, True)),
        "syncat50k": made("syncat50k.csv", ["data.test_rows=10000", *_CAT_SCHEMA], "c1", lambda p: _synthetic(p, 50_000, 9, False)),
        "ids2h": made("ids2.csv", ['data.split="hash"', *_ID_SCHEMA], "item", lambda p: _id_only(p, 20_000, 1_000, 300, 1)),
        "t30h": made("t30.csv", ['data.split="hash"', *_ID_SCHEMA], "item", lambda p: _id_only(p, 30_000, 800, 200, 3)),
        "idsh": made("ids.csv", ['data.split="hash"', *_ID_SCHEMA], "item", lambda p: _id_only(p, 60_000, 2_000, 500, 0)),
        "idst": made("ids.csv", _ID_SCHEMA, "item", lambda p: _id_only(p, 60_000, 2_000, 500, 0)),
        "ids3h": made("ids3.csv", ['data.split="hash"', *_ID_SCHEMA], "item", lambda p: _id_only(p, 100_000, 5_000, 2_000, 2)),
    }


def train_auc(spec: SmallFile, model: str, seed: int, run_dir: Path) -> dict:
    """``tierec train`` with only the file's config and overrides given (plus model and seed); its summary."""
    from tierec.cli import main

    args = ["train", "--run-dir", str(run_dir), "--overwrite", "--no-progress"]
    if spec.config is not None:
        args += ["--config", str(spec.config)]
    for o in [*spec.over, f'model.name="{model}"', f"train.seed={seed}", "train.plots=false"]:
        args += ["--set", o]
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    if code != 0:
        raise SystemExit(f"tierec train {' '.join(args)} exited {code}")
    return json.loads((run_dir / "summary.json").read_text())


def _cpu() -> str:
    """The CPU model and the flags that matter here (bf16 and AMX change the dense model's arithmetic)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "unknown")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    return f"{model}; " + " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags)


def markdown(paths: list[Path]) -> str:
    """One row per file of the JSON results in ``paths``: each model's mean test AUC (its gap to logistic regression)."""
    rows: dict[str, dict] = {}
    for path in paths:
        for r in json.loads(path.read_text())["results"]:
            rows.setdefault(r["file"], {"train": r["train_rows"], "test": r["test_rows"], "lr": r["logistic_regression_auc"],
                                        "pop": next(v for k, v in r.items() if k.startswith("popularity_of_")), "seeds": len(r["runs"])})
            rows[r["file"]][r["model"]] = r["mean_test_auc"]
    out = ["| file (train / test rows, seeds) | DLRM | DeepFM | DCN-v2 | Wide&Deep | logistic regression | item popularity |",
           "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        cells = [f"{r[m]:.4f} ({r[m] - r['lr']:+.4f})" if m in r else "" for m in MODELS]
        out.append(f"| {name} ({r['train']:,} / {r['test']:,}, {r['seeds']}) | " + " | ".join(cells) + f" | {r['lr']:.4f} | {r['pop']:.4f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.small_data", description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, help="directory for the files and runs (created)")
    p.add_argument("--table", nargs="+", type=Path, help="print the results in these JSON files as a markdown table, and stop")
    p.add_argument("--files", default="", help="comma-separated names (default: all)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--json", type=Path, help="write the results here")
    a = p.parse_args(argv)
    if a.table:
        print(markdown(a.table))
        return 0
    if a.work is None:
        p.error("--work is required (or --table)")
    a.work.mkdir(parents=True, exist_ok=True)
    table = files(a.work)
    names = a.files.split(",") if a.files else list(table)
    seeds = [int(s) for s in a.seeds.split(",")]
    results = []
    print(f"{'file':10s} {'model':9s} {'mean AUC':>8s} {'per seed':>23s} {'LR':>7s} {'gap':>7s} {'popul.':>7s}")
    for name in names:
        spec = table[name]
        over, item = spec.over, spec.item
        if name.startswith("crit") and not CRITEO.is_file():
            print(f"{name}: skipped ({CRITEO} is absent)")
            continue
        if spec.make is not None and spec.path is not None and not spec.path.exists():
            spec.make(spec.path)
        cfg = load_config(spec.config, over)
        train, test = split_rows(cfg, "train"), split_rows(cfg, "test")
        lr = logistic_regression(train[:3], test[:3])
        popularity = item_popularity(train[:3], test[:3], column=train[3].index(item))
        for model in a.models.split(","):
            runs = []
            for seed in seeds:
                t0 = time.perf_counter()
                s = train_auc(spec, model, seed, a.work / "runs" / f"{name}-{model}-{seed}")
                runs.append({"seed": seed, "test_auc": s["test_auc"], "steps": s["steps"], "seconds": time.perf_counter() - t0})
            mean = statistics.fmean(r["test_auc"] for r in runs)
            row = {"file": name, "model": model, "train_rows": int(len(train[2])), "test_rows": int(len(test[2])),
                   "mean_test_auc": mean, "runs": runs, "logistic_regression_auc": lr["auc"], "logistic_regression_C": lr["C"],
                   "gap": mean - lr["auc"], f"popularity_of_{item}_auc": popularity, "overrides": over}
            results.append(row)
            per = " ".join(f"{r['test_auc']:.4f}" for r in runs)
            print(f"{name:10s} {model:9s} {mean:8.4f} {per:>23s} {lr['auc']:7.4f} {mean - lr['auc']:+7.4f} {popularity:7.4f}", flush=True)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"host": _cpu(), "command": "python -m benchmarks.small_data " + " ".join(sys.argv[1:] if argv is None else argv), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
