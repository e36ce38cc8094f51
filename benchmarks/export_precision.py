"""Test AUC of fp16 and int8 (row-wise) exports against the fp32 export of the same checkpoint.

Trains a model with ``tierec train`` on a raw Criteo file (default: the sample
``../shared/data/criteo/train_head10000.txt``, last 2,000 rows held out; the
size-chosen defaults apply) and on tierec's synthetic data written as a Criteo
file, exports the checkpoint at each precision, scores the held-out rows from
their raw text with the library scorer and prints AUC, logloss, the largest
score change against fp32 and the tables' bytes. Nothing is copied into the
repository; runs and exports go under ``--work``.

    python -m benchmarks.export_precision --work /tmp/prec --json docs/bench/export_precision.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

from tierec.cli import main as tierec
from tierec.config import SyntheticConfig
from tierec.data.schema import CRITEO_COLUMNS
from tierec.data.synthetic import SyntheticData
from tierec.serving.export import ExportConfig, export_checkpoint
from tierec.serving.scorer import Scorer
from tierec.train.metrics import auc

CRITEO = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "criteo" / "train_head10000.txt"


def write_synthetic_criteo(path: Path, rows: int, seed: int, first: int = 0) -> None:
    """Rows ``first..first+rows-1`` of the synthetic generator as a raw Criteo TSV (hex ids, dense values as written)."""
    data = SyntheticData(SyntheticConfig(seed=seed, train_rows=first + rows))
    block = data.block("train", first, rows)[0]
    ids = block.values.reshape(26, rows) & ((1 << 32) - 1)
    with open(path, "w") as f:
        for i in range(rows):
            dense = "\t".join(str(int(round(math.expm1(float(v))))) for v in block.dense[i])  # log1p undoes it
            cats = "\t".join(f"{int(v):08x}" for v in ids[:, i])
            f.write(f"{int(block.labels[i])}\t{dense}\t{cats}\n")


def held_out(path: Path, rows: int) -> tuple[list[dict[str, str]], np.ndarray]:
    lines = path.read_text().splitlines()[-rows:]
    records = [dict(zip(CRITEO_COLUMNS, line.split("\t"))) for line in lines]
    return records, np.array([float(r["label"]) for r in records], np.float32)


def measure(name: str, data: Path, test_rows: int, work: Path, model: str) -> list[dict]:
    run = work / f"run-{name}"
    args = ["train", "--run-dir", str(run), "--overwrite", "--no-progress", "--set", f"data.source={json.dumps(str(data))}",
            "--set", f"data.test_rows={test_rows}", "--set", f'model.name="{model}"', "--set", "train.plots=false"]  # fmt: skip
    assert tierec(args) == 0
    records, labels = held_out(data, test_rows)
    out, base = [], None
    for precision in ("fp32", "fp16", "int8"):
        ex = work / f"export-{name}-{precision}"
        export_checkpoint(run, ex, ExportConfig(precision=precision))
        scores = Scorer.load(ex).score(records)
        base = scores if base is None else base
        p = np.clip(scores.astype(np.float64), 1e-7, 1 - 1e-7)
        logloss = float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))
        nbytes = sum(f.stat().st_size for f in (ex / "tables").iterdir())
        out.append({"data": name, "model": model, "precision": precision, "rows": len(records),
                    "auc": auc(torch.from_numpy(scores), torch.from_numpy(labels)), "logloss": logloss,
                    "max_abs_score_change": float(np.abs(scores - base).max()), "table_bytes": nbytes})  # fmt: skip
        print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="directory for runs and exports")
    ap.add_argument("--model", default="dlrm")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    if CRITEO.exists():
        results += measure("criteo-head10000", CRITEO, 2000, args.work, args.model)
    syn = args.work / "synthetic12k.txt"
    write_synthetic_criteo(syn, 12000, seed=8)
    results += measure("synthetic12k", syn, 2000, args.work, args.model)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
