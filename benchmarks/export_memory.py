"""Peak memory of ``tierec export`` on a table several times its merge budget.

Writes a checkpoint whose table C3 holds ``--rows`` rows of dim ``--dim`` (random
values, ids in scrambled order, row-wise Adagrad state; streamed, never held
whole), then exports it with ``--budget`` bytes of merge blocks. The export runs in a
fresh process, after a small export so that torch.export's own one-time memory
is in the baseline; the figure is that process's peak RSS during the big export
above the baseline, beside the table's bytes. Everything goes under ``--work``.

    python -m benchmarks.export_memory --work /tmp/expmem --rows 4000000 --dim 16 --budget 16MiB
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tierec.config import load_config, to_dict
from tierec.data import CRITEO_CATEGORICAL
from tierec.serving.export import ExportConfig, export_checkpoint
from tierec.sizes import parse_size
from tierec.train.checkpoint import CHUNK_BYTES, save_checkpoint
from tierec.train.components import Components
from tierec.train.state import snapshot_state


def write_checkpoint(run: Path, rows: int, dim: int, seed: int = 0) -> int:
    """A checkpoint of the synthetic DLRM with ``rows`` rows in table C3 (a few in the others); returns C3's bytes."""
    cfg = load_config(None, [f"embedding.dim={dim}"])
    parts = Components.build(cfg, list(CRITEO_CATEGORICAL), n_dense=13)
    tensors, skeleton = snapshot_state(parts)
    per_chunk = max(1, CHUNK_BYTES // (8 + 4 * dim + 4))
    rng = np.random.default_rng(seed)

    def chunks():
        for a in range(0, rows, per_chunk):
            n = min(per_chunk, rows - a)
            ids = (np.arange(a, a + n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) & np.uint64((1 << 63) - 1)
            yield "emb/C3", {"ids": torch.from_numpy(ids.astype(np.int64)),
                             "weights": torch.from_numpy(rng.standard_normal((n, dim), dtype=np.float32)),
                             "opt.sum": torch.zeros(n)}  # fmt: skip

    save_checkpoint(run / "checkpoints", 1, tensors, {"config": to_dict(cfg), "state": skeleton}, rows=chunks())
    return rows * (8 + 4 * dim)


def measure(work: Path, budget: int) -> dict:
    """In a fresh process: the small export (torch.export's one-time memory), then the big one's peak RSS."""
    export_checkpoint(work / "small", work / "small-export")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    export_checkpoint(work / "big", work / "big-export", ExportConfig(merge_budget=budget))
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"baseline_rss_bytes": base, "peak_rss_bytes": peak, "peak_above_baseline_bytes": peak - base, "export_seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--budget", default="16MiB", help="merge budget (bytes of run blocks held at once)")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the fresh process's part
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    budget = parse_size(args.budget)
    if args.measure:
        print(json.dumps(measure(args.work, budget)))
        return
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    write_checkpoint(args.work / "small", 1000, args.dim)
    table_bytes = write_checkpoint(args.work / "big", args.rows, args.dim)
    out = subprocess.run([sys.executable, "-m", "benchmarks.export_memory", "--work", str(args.work), "--budget",
                          str(budget), "--measure"], capture_output=True, text=True, check=True)  # fmt: skip
    result = {"rows": args.rows, "dim": args.dim, "table_bytes": table_bytes, "merge_budget_bytes": budget,
              "checkpoint_chunk_bytes": CHUNK_BYTES, **json.loads(out.stdout.strip().splitlines()[-1])}  # fmt: skip
    print(json.dumps(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
