"""A table far beyond its memory budget, end to end: trained, checkpointed, resumed, beside the same run in memory.

Runs ``tierec train`` on the Criteo-shaped synthetic stream (26 sparse features,
Zipf skew, dim 64, row-wise Adagrad) three times, each in a fresh process:

1. ``tiered``: ``store.memory_budget`` (at most 1/8 of the table's bytes by
   default), rows spilling to ``--disk``; stops halfway and checkpoints;
2. ``resumed``: the same run directory resumed to the end (loads the checkpoint,
   trains, saves again);
3. ``memory``: the whole stream with every row in RAM, where it fits.

and a tiny run for the process's baseline RSS (interpreter, torch, numba). It
reports samples/s over time, peak RSS (``ru_maxrss``: it covers the saves and
the load) beside budget + bookkeeping, bytes read from and written to the disk
tier, and test AUC of the tiered and in-memory runs.

    python -m benchmarks.scale --scale 0.5 --rows 4000000 --budget-fraction 0.125 --disk /var/tmp --json out.json

>>> from benchmarks.scale import bound_bytes
>>> bound_bytes(budget=1 << 30, ids=10_000_000, baseline=500 << 20, dense=1 << 20) > (1 << 30) + (500 << 20)
True
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DIRECTORY_BYTES_PER_ID = 24  # the store's RAM per id, at most (docs/scale.md)
CHECKPOINT_CHUNKS = 8  # chunk-sized buffers a streamed save or load holds, at most
CHUNK_BYTES = 1 << 24


def bound_bytes(budget: int, ids: int, baseline: int, dense: int) -> int:
    """Budget + bookkeeping: the process's baseline, the directory, the dense model, a checkpoint's working set,
    and 64 MiB of per-batch scratch and allocator slack."""
    return budget + ids * DIRECTORY_BYTES_PER_ID + baseline + dense + CHECKPOINT_CHUNKS * CHUNK_BYTES + (64 << 20)


def _train(run: Path, overrides: list[str], resume: bool = False) -> tuple[dict, float]:
    args = [sys.executable, "-m", "tierec", "train", "--run-dir", str(run), "--no-progress"]
    if resume:
        args.append("--resume")
    for o in overrides:
        args += ["--set", o]
    t0 = time.perf_counter()
    out = subprocess.run(args, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return json.loads((run / "summary.json").read_text()), wall


def _rates(run: Path, batch: int, after: int = 0) -> list[tuple[int, float]]:
    """(step, samples/s over the steps since the previous record) of the run's train records after step ``after``.

    The records carry the cumulative rate of their process; busy seconds are recovered from it.
    """
    out, prev_step, prev_busy = [], after, 0.0
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") != "train" or "samples_per_s" not in r or r["step"] <= after:
            continue
        busy = (r["step"] - after) * batch / r["samples_per_s"]
        if busy > prev_busy:
            out.append((r["step"], round((r["step"] - prev_step) * batch / (busy - prev_busy))))
        prev_step, prev_busy = r["step"], busy
    return out


def run(rows: int, scale: float, zipf: float, dim: int, batch: int, budget_fraction: float, disk: str, memory: bool,
        work: Path) -> dict:
    steps = rows // batch
    common = [
        f"data.synthetic.train_rows={rows}", "data.synthetic.test_rows=100000", f"data.synthetic.cardinality_scale={scale}",
        f"data.synthetic.zipf={zipf}", f"embedding.dim={dim}", f"train.batch_size={batch}", "train.eval_batches=0",
        f"train.checkpoint_every={steps // 2}", "train.progress=false", f"train.max_steps={steps}",
    ]  # fmt: skip
    # the baseline process: same code paths, a tiny table
    base, _ = _train(work / "base", ["data.synthetic.train_rows=20000", "data.synthetic.test_rows=2000",
                                     "data.synthetic.cardinality_scale=0.0001", f"embedding.dim={dim}", "train.progress=false"])
    out: dict = {"rows": rows, "steps": steps, "batch": batch, "dim": dim, "scale": scale, "zipf": zipf,
                 "baseline_rss_bytes": base["peak_memory_bytes"]}
    if memory:
        mem, wall = _train(work / "memory", common)
        out["memory"] = {**_summary(mem), "wall_s": wall, "rates": _rates(work / "memory", batch)}
        table = mem["embedding_bytes"]
    else:
        table = None
    # the table's bytes of rows (weights + Adagrad state) decide the budget; without the memory run, a first
    # tiered run over the stream counts them
    ids_hint = out["memory"]["embedding_rows"] if memory else None
    row_bytes = 4 * (dim + 1)
    if ids_hint is None:
        raise SystemExit("--no-memory needs --budget")  # keep it simple: the memory run sizes the budget
    budget = int(budget_fraction * ids_hint * row_bytes)
    store = ["store.enabled=true", f"store.memory_budget={budget}", f"store.cache_size={budget // 2}", f"store.disk_path={disk}"]
    half, wall1 = _train(work / "tiered", common + store + [f"train.max_steps={steps // 2}"])
    rates1 = _rates(work / "tiered", batch)
    full, wall2 = _train(work / "tiered", [f"train.max_steps={steps}"], resume=True)
    rates2 = _rates(work / "tiered", batch, after=steps // 2)
    ckpt = work / "tiered" / "checkpoints"
    ckpt_bytes = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    out["budget_bytes"] = budget
    out["table_bytes"] = ids_hint * row_bytes
    out["memory_table_bytes"] = table
    out["tiered_half"] = {**_summary(half), "wall_s": wall1, "rates": rates1}
    out["tiered_resumed"] = {**_summary(full), "wall_s": wall2, "rates": rates2}
    out["checkpoint_bytes"] = ckpt_bytes
    dense = 4 << 20
    for key in ("tiered_half", "tiered_resumed"):
        r = out[key]
        r["bound_bytes"] = bound_bytes(budget, r["embedding_rows"], out["baseline_rss_bytes"], dense)
        r["within_bound"] = r["peak_memory_bytes"] <= r["bound_bytes"]
    return out


def _summary(s: dict) -> dict:
    keep = ("steps", "test_auc", "test_logloss", "train_samples_per_s", "embedding_rows", "embedding_bytes",
            "peak_memory_bytes", "planted_auc")
    out = {k: s[k] for k in keep if k in s}
    st = s.get("store")
    if st:
        out["store"] = {k: v for k, v in st.items() if k != "pipeline"}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=4_000_000, help="training samples of the stream")
    p.add_argument("--scale", type=float, default=1.0, help="data.synthetic.cardinality_scale (Criteo's = 1)")
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--budget-fraction", type=float, default=0.125, help="memory budget / table bytes")
    p.add_argument("--disk", default="", help="directory of the disk tier (default: the temp dir)")
    p.add_argument("--work", default="", help="directory for the run directories (default: a temp dir)")
    p.add_argument("--json", default="", help="write the result here too")
    a = p.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="tierec-scale-"))
    res = run(a.rows, a.scale, a.zipf, a.dim, a.batch, a.budget_fraction, a.disk or tempfile.gettempdir(), True, work)
    text = json.dumps(res, indent=1)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
