"""A table far beyond its memory budget, end to end: trained, checkpointed, resumed, beside the same run in memory.

Runs ``tierec train`` on the Criteo-shaped synthetic stream (26 sparse features,
Zipf skew, dim 64, row-wise Adagrad) in three stages, each a fresh process:

1. ``memory``: the whole stream with every row in RAM (where it fits); it counts
   the ids, which size the budget (and a tiny run gives the process's baseline RSS);
2. ``tiered``: ``store.memory_budget`` (at most 1/8 of the table's bytes by
   default), rows spilling to ``--disk``; stops halfway and checkpoints;
3. ``resumed``: the same run directory resumed to the end (loads the checkpoint,
   trains, saves again);
4. ``two``: the same stream on 2 processes (``--nproc 2``), each tiering its
   shard with half the budget (``store.memory_budget`` is per process).

``--stage all`` runs the four; ``--stage memory`` etc. one at a time (a long
stream in several shorter invocations), ``--stage report`` only reports. It
reports samples/s over time, peak RSS (``ru_maxrss``: it covers the saves and
the load) beside budget + bookkeeping, bytes read from and written to the disk
tier, and test AUC of the tiered and in-memory runs.

    python -m benchmarks.scale --scale 0.5 --rows 4000000 --budget-fraction 0.125 --disk /var/tmp --json out.json
    python -m benchmarks.scale --rows 12000000 --scale 4 --work w --disk w --stage memory   # then tiered, resumed

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


def horizon_bytes(horizon: int, batch: int, ids: int) -> int:
    """What ``store.horizon`` holds outside the budget (tierec/store/horizon.py): 8 bytes per row; per id of
    the batches held, a 16-byte entry and the batch's own 8-byte id and 8-byte offset; 56 bytes per sample
    of dense features and label (26 sparse and 13 dense features)."""
    if horizon == 0:
        return 0
    return ids * 8 + horizon * batch * (26 * (16 + 8 + 8) + 4 * 14)


def bound_bytes(budget: int, ids: int, baseline: int, dense: int, horizon: int = 0) -> int:
    """Budget + bookkeeping: the process's baseline, the directory, the dense model, a checkpoint's working set,
    64 MiB of per-batch scratch and allocator slack, and ``horizon`` bytes (:func:`horizon_bytes`)."""
    return budget + ids * DIRECTORY_BYTES_PER_ID + baseline + dense + CHECKPOINT_CHUNKS * CHUNK_BYTES + (64 << 20) + horizon


def _train(run: Path, overrides: list[str], resume: bool = False, nproc: int = 1) -> tuple[dict, float]:
    args = [sys.executable, "-m", "tierec", "train", "--run-dir", str(run), "--no-progress"]
    if nproc > 1:
        args += ["--nproc", str(nproc)]
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


STAGES = ("memory", "tiered", "resumed", "two")


def _common(rows: int, scale: float, zipf: float, dim: int, batch: int) -> list[str]:
    steps = rows // batch
    return [
        f"data.synthetic.train_rows={rows}", "data.synthetic.test_rows=100000", f"data.synthetic.cardinality_scale={scale}",
        f"data.synthetic.zipf={zipf}", f"embedding.dim={dim}", f"train.batch_size={batch}", "train.eval_batches=0",
        f"train.checkpoint_every={steps // 2}", "train.progress=false", f"train.max_steps={steps}",
    ]  # fmt: skip


def run_stage(stage: str, rows: int, scale: float, zipf: float, dim: int, batch: int, budget_fraction: float,
              disk: str, work: Path, store_set: tuple[str, ...] = ()) -> None:
    """One of ``STAGES``, into ``work`` (each stage is one process run; a stage reads what the previous wrote)."""
    steps = rows // batch
    common = _common(rows, scale, zipf, dim, batch)
    work.mkdir(parents=True, exist_ok=True)
    if stage == "memory":
        # the baseline process: same code paths, a tiny table
        base, _ = _train(work / "base", ["data.synthetic.train_rows=20000", "data.synthetic.test_rows=2000",
                                         "data.synthetic.cardinality_scale=0.0001", f"embedding.dim={dim}", "train.progress=false"])
        _, wall = _train(work / "memory", common)
        (work / "memory.wall").write_text(f"{wall}\n")
        return
    # the table's bytes of rows (weights + Adagrad state) decide the budget: the memory run counts the ids
    summary = work / "memory" / "summary.json"
    if not summary.exists():
        raise SystemExit(f"benchmarks.scale: stage {stage} needs the memory stage's {summary} (its ids set the budget): "
                         f"run --stage memory with the same --work first")
    ids = json.loads(summary.read_text())["embedding_rows"]
    budget = int(budget_fraction * ids * 4 * (dim + 1))
    def store(b: int, where: str) -> list[str]:
        return ["store.enabled=true", f"store.memory_budget={b}", f"store.cache_size={b // 2}", f"store.disk_path={where}",
                *store_set]

    if stage == "tiered":
        _, wall = _train(work / "tiered", common + store(budget, disk) + [f"train.max_steps={steps // 2}"])
    elif stage == "two":  # each process tiers its shard in <disk>/two/rank-<r> with half the budget
        _, wall = _train(work / "two", common + store(budget // 2, str(Path(disk) / "two")), nproc=2)
    else:
        if not (work / "tiered.wall").exists():
            raise SystemExit(f"{work}: run --stage tiered first")
        _, wall = _train(work / "tiered", [f"train.max_steps={steps}"], resume=True)
    (work / f"{stage}.wall").write_text(f"{wall}\n")


def report(rows: int, scale: float, zipf: float, dim: int, batch: int, budget_fraction: float, work: Path) -> dict:
    """The stages' results found in ``work``, with the bound each tiered run must hold."""
    steps = rows // batch
    base = json.loads((work / "base" / "summary.json").read_text())
    out: dict = {"rows": rows, "steps": steps, "batch": batch, "dim": dim, "scale": scale, "zipf": zipf,
                 "baseline_rss_bytes": base["peak_memory_bytes"]}
    mem = json.loads((work / "memory" / "summary.json").read_text())
    out["memory"] = {**_summary(mem), "wall_s": float((work / "memory.wall").read_text()), "rates": _rates(work / "memory", batch)}
    ids = mem["embedding_rows"]
    budget = int(budget_fraction * ids * 4 * (dim + 1))
    out["budget_bytes"] = budget
    out["table_bytes"] = ids * 4 * (dim + 1)
    out["memory_table_bytes"] = mem["embedding_bytes"]
    tiered = work / "tiered"
    half_summary = tiered / "summary.half.json"
    if (work / "tiered.wall").exists() and not half_summary.exists():  # keep the first half's summary past the resume
        half_summary.write_text((tiered / "summary.json").read_text())
    for key, stage, after in (("tiered_half", "tiered", 0), ("tiered_resumed", "resumed", steps // 2)):
        if not (work / f"{stage}.wall").exists():
            continue
        s = json.loads((half_summary if stage == "tiered" else tiered / "summary.json").read_text())
        rates = [r for r in _rates(tiered, batch, after=after) if stage == "resumed" or r[0] <= steps // 2]
        r = {**_summary(s), "wall_s": float((work / f"{stage}.wall").read_text()), "rates": rates}
        r["horizon"] = s.get("store", {}).get("pipeline", {}).get("horizon", 0)
        r["horizon_bytes"] = horizon_bytes(r["horizon"], batch, r["embedding_rows"])
        r["bound_bytes"] = bound_bytes(budget, r["embedding_rows"], out["baseline_rss_bytes"], 4 << 20, r["horizon_bytes"])
        r["within_bound"] = r["peak_memory_bytes"] <= r["bound_bytes"]
        out[key] = r
    if (work / "two.wall").exists():
        s = json.loads((work / "two" / "summary.json").read_text())
        r = {**_summary(s), "wall_s": float((work / "two.wall").read_text()), "rates": _rates(work / "two", batch)}
        r["peak_memory_bytes_per_process"] = s.get("peak_memory_bytes_per_process", [])
        # each process: half the budget, its share of the ids (the bound uses half the ids: sharded by id hash)
        r["bound_bytes_per_process"] = bound_bytes(budget // 2, r["embedding_rows"] // 2, out["baseline_rss_bytes"], 4 << 20)
        r["within_bound"] = all(m <= r["bound_bytes_per_process"] for m in r["peak_memory_bytes_per_process"])
        out["two_processes"] = r
    out["checkpoint_bytes"] = sum(p.stat().st_size for p in (tiered / "checkpoints").rglob("*") if p.is_file()) if tiered.exists() else 0
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
    p.add_argument("--stage", choices=("all", *STAGES, "report"), default="all",
                   help="run one stage (memory, then tiered, then resumed, then two: each one run) or all; then report")
    p.add_argument("--store-set", action="append", default=[], metavar="KEY=VALUE",
                   help="another store.* setting of the tiered stages (repeatable), e.g. store.prefetch=false")
    a = p.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="tierec-scale-"))
    shape = (a.rows, a.scale, a.zipf, a.dim, a.batch)
    for stage in STAGES if a.stage == "all" else () if a.stage == "report" else (a.stage,):
        run_stage(stage, *shape, a.budget_fraction, a.disk or tempfile.gettempdir(), work, tuple(a.store_set))
        if stage == "tiered":
            report(*shape, a.budget_fraction, work)  # keeps the first half's summary
    res = report(*shape, a.budget_fraction, work)
    text = json.dumps(res, indent=1)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
