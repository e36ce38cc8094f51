"""The GPU as a placement, measured: DLRM on the GPU against the same run on the CPU cores, and tiered
tables with the fast tier in GPU memory against all rows on the GPU.

    python -m benchmarks.gpu_check --out gpu_check.json          # on a machine with one CUDA device
    python -m benchmarks.gpu_check --device cpu --rows 20000 --steps 4 --repeats 1 --tiered-scale 0.01   # CPU smoke

Runs are whole ``tierec train`` runs (the Trainer, in this process, so the
numba kernels compile once: a warm-up run goes first and is not counted), on
the built-in synthetic data in fp32. Setups take turns, ``--repeats`` times;
the figures are medians. ``benchmarks/gpu_check.sh`` runs this after the CUDA
tests; docs/gpu.md holds its figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.run import machine
from tierec.config import load_config
from tierec.train.trainer import Trainer


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="the accelerator (cpu: a smoke run of this script)")
    p.add_argument("--rows", type=int, default=1_000_000, help="synthetic training rows")
    p.add_argument("--test-rows", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=200, help="training steps per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--scale", type=float, default=0.01, help="end to end: synthetic cardinality_scale")
    p.add_argument("--tiered-scale", type=float, default=0.1, help="tiered: synthetic cardinality_scale (larger tables)")
    p.add_argument("--work", default="", help="run directories and the disk tier (default: a temp dir)")
    p.add_argument("--out", default="", help="write the results as JSON here")
    return p


def _run(overrides: list[str], run_dir: Path) -> dict:
    cfg = load_config(None, ["train.progress=false", "train.plots=false", "train.precision=fp32",
                             "train.eval_every=0", "train.checkpoint_every=0", *overrides])
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    s = Trainer(cfg, run_dir, echo=lambda _: None).fit()
    out = {
        "samples_per_s": s["train_samples_per_s"],
        "test_auc": s["test_auc"],
        "steps": s["steps"],
        "wall_s": time.perf_counter() - t0,
        "embedding_bytes": s["embedding_bytes"],
        "embedding_rows": s["embedding_rows"],
        "peak_rss_bytes": s["peak_memory_bytes"],
    }
    if torch.cuda.is_available():
        out["gpu_peak_bytes"] = torch.cuda.max_memory_allocated()
    if "store" in s:  # tiered: hit rate, rows read from disk, the pipeline's timings
        out["store"] = s["store"]
    return out


def _compare(setups: dict[str, list[str]], repeats: int, work: Path) -> dict[str, dict]:
    """Each setup ``repeats`` times, taking turns; per setup the median samples/s and every run."""
    runs: dict[str, list[dict]] = {name: [] for name in setups}
    for r in range(repeats):
        for name, overrides in setups.items():
            runs[name].append(_run(overrides, work / f"{name}-{r}"))
            print(f"  {name} #{r}: {runs[name][-1]['samples_per_s']:,.0f} samples/s, test AUC {runs[name][-1]['test_auc']:.5f}", flush=True)
    return {
        name: {"median_samples_per_s": statistics.median(x["samples_per_s"] for x in rs), "runs": rs}
        for name, rs in runs.items()
    }


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="tierec-gpu-"))
    data = [f"data.synthetic.train_rows={a.rows}", f"data.synthetic.test_rows={a.test_rows}",
            f"train.batch_size={a.batch}", f"train.max_steps={a.steps}"]
    result: dict = {"machine": machine(), "args": vars(a)}
    if torch.cuda.is_available():
        result["gpu"] = {"name": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
    print(f"warm-up (kernel compilation) on cpu and {a.device}", flush=True)
    for dev in dict.fromkeys(("cpu", a.device)):
        _run(["data.synthetic.train_rows=8192", "data.synthetic.test_rows=2048", "train.batch_size=1024",
              f"train.device={dev}"], work / f"warmup-{dev}")

    print(f"DLRM end to end, {a.device} against the CPU cores", flush=True)
    e2e = [*data, f"data.synthetic.cardinality_scale={a.scale}"]
    setups = {a.device: [*e2e, f"train.device={a.device}"], "cpu": [*e2e, "train.device=cpu"],
              f"{a.device}_bf16": [*e2e, f"train.device={a.device}", "train.precision=bf16"]}
    result["e2e"] = _compare(setups, a.repeats, work)
    result["e2e"]["speedup"] = result["e2e"][a.device]["median_samples_per_s"] / result["e2e"]["cpu"]["median_samples_per_s"]

    print(f"tiered: fast tier in {a.device} memory, host tier a quarter of the table, the rest on disk", flush=True)
    big = [*data, f"data.synthetic.cardinality_scale={a.tiered_scale}", f"train.device={a.device}"]
    table = _run(big, work / "size")["embedding_bytes"]  # all rows on the device: the table's size
    tiers = ["store.enabled=true", f"store.cache_size={max(table // 8, 1 << 20)}", f"store.host_size={table // 4}",
             f"store.disk_path={work / 'disk'}"]
    setups = {"all_on_device": big, "tiered": [*big, *tiers, "store.prefetch=false"],  # on demand; read ahead (the default):
              "tiered_prefetch": [*big, *tiers, "store.prefetch=true"]}
    result["tiered"] = _compare(setups, a.repeats, work)
    result["tiered"]["table_bytes"] = table
    base = result["tiered"]["all_on_device"]["median_samples_per_s"]
    result["tiered"]["ratio"] = result["tiered"]["tiered"]["median_samples_per_s"] / base
    result["tiered"]["ratio_prefetch"] = result["tiered"]["tiered_prefetch"]["median_samples_per_s"] / base

    print(json.dumps({k: result[s][k] for s, k in (("e2e", "speedup"), ("tiered", "ratio"), ("tiered", "ratio_prefetch"))}), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
