"""PRUNING: embedding bytes against test AUC, for in-training dim pruning and two baselines.

For each data set, full training runs (``tierec.train.Trainer``, the same
config apart from the method) at no pruning and at each target ratio:

- ``prune``: chunked rows pruned by importance = decayed access frequency x
  gradient magnitude (``prune.importance=gradient``), with regrowth;
- ``frequency``: the same machinery and the same bytes, importance = access
  frequency alone (dims assigned by frequency);
- ``prune_noshrink`` (ablation, not run by default): ``prune`` with
  ``prune.shrinkage=0``, each row's own gradient sum unshrunk;
- ``uniform``: every row the same smaller dim, ``embedding.dim = D / ratio``
  (a plain, unpruned run).

Bytes are reported two ways: ``value`` bytes are the embedding parameters and
their optimizer state (live chunks with their importance scores, plus per-row
optimizer state; for plain tables rows x (weights + state)), what pruning
shrinks; ``allocated`` bytes are everything the tables hold (capacity slack,
hash index, chunk maps). Pruning runs get a byte budget: the unpruned run's
value bytes over the ratio. AUC is averaged over seeds; the drop against the
unpruned run is paired by seed. A throughput check (``step_throughput``)
alternates timed rounds of unpruned and pruned training steps in one process.

Run from the repository root (docs/pruning.md has the exact commands):

    python -m benchmarks.pruning --data synthetic --seeds 0,1 --out runs/bench/pruning_synthetic.json
    python -m benchmarks.pruning --data criteo --seeds 0,1,2,3,4 --out runs/bench/pruning_criteo.json
    python -m benchmarks.pruning --data synthetic --skip-sweep --throughput-rounds 9 --out runs/bench/pruning_tp.json
    python -m benchmarks.pruning --plot docs/pruning.png runs/bench/pruning_*.json

>>> from benchmarks.pruning import overrides
>>> overrides("synthetic", "uniform", 4, seed=0)[-1]
'embedding.dim=4'
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import markdown_table
from tierec.config import Config, load_config
from tierec.embedding.optimizers import state_shapes
from tierec.train.trainer import Trainer

CRITEO = "../shared/data/criteo/train_head10000.txt"
DATASETS = {
    # the built-in default: 1M Criteo-shaped rows, 100k test rows, batch 2048 (489 steps)
    "synthetic": [],
    # 8,000 train rows, 2,000 test rows (the file's last); small batches, so there are steps to prune at
    "criteo": [f"data.source={CRITEO}", "data.test_rows=2000", "train.batch_size=64", "prune.every=10"],
}
RATIOS = (2, 4, 8, 16, 32, 64, 128, 256, 512)  # uniform dims stop at 16x (dim 1)
METHODS = ("prune", "frequency", "uniform")  # the default set; also the VARIANTS below
# Variants of a pruning method: extra config overrides on top of it.
VARIANTS = {
    "prune_noshrink": ("prune", ["prune.shrinkage=0"]),
    "prune_init4": ("prune", ["prune.init_dim=4"]),
    "frequency_init4": ("frequency", ["prune.init_dim=4"]),
}
DIM = 16
DENSE_LR = 0.003


def overrides(data: str, method: str, ratio: int, seed: int, budget: int = 0) -> list[str]:
    """Config overrides of one run; pruning runs get ``budget`` bytes (else ``target_ratio``)."""
    # dense lr pinned to the default the documented sweep was measured with (docs/pruning.md)
    over = DATASETS[data] + [f"train.seed={seed}", "train.progress=false", f"embedding.dim={DIM}", f"train.dense_lr={DENSE_LR}"]
    base, extra = VARIANTS.get(method, (method, []))
    if base in ("prune", "frequency"):
        importance = "frequency" if base == "frequency" else "gradient"
        target = f"prune.memory_budget={budget}" if budget else f"prune.target_ratio={ratio}"
        over += ["prune.enabled=true", target, f"prune.importance={importance}", *extra]
    elif method == "uniform":
        over += [f"embedding.dim={DIM // ratio}"]
    return over


def plain_value_bytes(cfg: Config, rows: int) -> int:  # rows x (weights + optimizer state), bytes
    per = cfg.embedding.dim
    for shape in state_shapes(cfg.embedding.optimizer.kind, cfg.embedding.dim).values():
        per += shape[0] if shape else 1
    return rows * per * 4


def run_one(data: str, method: str, ratio: int, seed: int, root: Path, budget: int = 0) -> dict:
    cfg = load_config(None, overrides(data, method, ratio, seed, budget))
    run_dir = root / f"{data}_{method}_{ratio}_s{seed}"
    t0 = time.perf_counter()
    s = Trainer(cfg, run_dir, echo=lambda _: None).fit()
    shutil.rmtree(run_dir, ignore_errors=True)
    prune = s.get("prune")
    return {
        "data": data,
        "method": method,
        "ratio": ratio,
        "seed": seed,
        "auc": s["test_auc"],
        "logloss": s["test_logloss"],
        "value_bytes": prune["value_bytes"] if prune else plain_value_bytes(cfg, s["embedding_rows"]),
        "allocated_bytes": s["embedding_bytes"],
        "rows": s["embedding_rows"],
        "dim_hist": prune["dim_hist"] if prune else {str(cfg.embedding.dim): s["embedding_rows"]},
        "pruned_chunks": prune["pruned_chunks"] if prune else 0,
        "regrown_chunks": prune["regrown_chunks"] if prune else 0,
        "samples_per_s": s["train_samples_per_s"],
        "budget_bytes": budget,
        "seconds": time.perf_counter() - t0,
    }


def sweep(data: str, seeds: list[int], ratios: tuple[int, ...], methods: tuple[str, ...], root: Path, log) -> list[dict]:
    """Per seed: the unpruned run, then every method at every ratio.

    Pruning runs get a byte budget of the unpruned run's value bytes over the ratio, so
    every bytes figure is exact (``target_ratio`` counts an id evicted and seen again twice).
    """
    runs = []
    for seed in seeds:
        base = run_one(data, "none", 1, seed, root)
        runs.append(base)
        log(f"{data} seed {seed} none auc {base['auc']:.4f} value {base['value_bytes'] / 2**20:.2f} MiB")
        for ratio in ratios:
            for method in methods:
                if method == "uniform" and DIM % ratio:
                    continue  # no smaller dim: a row keeps at least one
                r = run_one(data, method, ratio, seed, root, budget=base["value_bytes"] // ratio)
                runs.append(r)
                log(f"{data} seed {seed} {method:9s} x{ratio:<3d} auc {r['auc']:.4f} value {r['value_bytes'] / 2**20:7.2f} MiB "
                    f"allocated {r['allocated_bytes'] / 2**20:7.2f} MiB  {r['samples_per_s']:,.0f} samples/s  {r['seconds']:.0f} s")
    return runs


def step_throughput(data: str, budget: int, steps: int, rounds: int, log) -> dict:
    """Training throughput, unpruned against pruned to ``budget`` bytes, in one process.

    Both sides train through the same stream of batches, ``rounds`` windows of ``steps``
    batches each (new ids keep arriving, as in a real pass); each window is timed for
    each side, the two taking turns to go first, in CPU seconds of the process (all
    threads) and in wall seconds. The pruned side runs its pruning steps when due,
    inside the timed region. The ratio is the median over windows; CPU time is the
    steadier measure on a shared machine.
    """
    from itertools import islice

    from tierec.data import open_source
    from tierec.train.components import Components
    from tierec.train.pipeline import TrainPipeline

    cfgs = {
        "off": load_config(None, overrides(data, "none", 1, 0)),
        "on": load_config(None, overrides(data, "prune", 1, 0) + [f"prune.memory_budget={budget}"]),
    }
    bs = cfgs["off"].train.batch_size
    src = open_source(cfgs["off"].data, "train", bs)
    tmp = Path(tempfile.mkdtemp(prefix="tierec_tp_"))
    runners = {k: Trainer(c, tmp / k, echo=lambda _: None) for k, c in cfgs.items()}
    parts = {k: Components.build(c, src.feature_names, src.n_dense) for k, c in cfgs.items()}
    pipes = {k: TrainPipeline(parts[k], runners[k].job, c) for k, c in cfgs.items()}
    done = {k: 0 for k in cfgs}

    def train(k: str, batches: list) -> tuple[float, float]:
        p, pipe = parts[k], pipes[k]
        c0, w0 = time.process_time(), time.perf_counter()
        for b in batches:
            pipe.step(b)
            done[k] += 1
            if p.pruner is not None and p.pruner.due(done[k]):
                p.pruner.step()
        return time.process_time() - c0, time.perf_counter() - w0

    warm = list(islice(iter(open_source(cfgs["off"].data, "train", bs)), 5))
    for k in cfgs:
        train(k, warm)  # compile and touch everything once
    cpu = {k: [] for k in cfgs}
    wall = {k: [] for k in cfgs}
    for r in range(rounds):
        window = list(islice(iter(open_source(cfgs["off"].data, "train", bs, start_batch=5 + r * steps)), steps))
        for k in (("off", "on") if r % 2 == 0 else ("on", "off")):
            c, w = train(k, window)
            cpu[k].append(c), wall[k].append(w)
        log(f"throughput window {r}: off {cpu['off'][-1]:.2f} / on {cpu['on'][-1]:.2f} CPU s, "
            f"off {wall['off'][-1]:.2f} / on {wall['on'][-1]:.2f} wall s")
    shutil.rmtree(tmp, ignore_errors=True)
    n = steps * bs
    stats = parts["on"].pruner.stats()
    return {
        "steps": steps, "rounds": rounds, "budget_bytes": budget,
        "samples_per_cpu_s": {k: n / statistics.median(v) for k, v in cpu.items()},
        "samples_per_wall_s": {k: n / statistics.median(v) for k, v in wall.items()},
        "ratio_cpu": statistics.median(a / b for a, b in zip(cpu["off"], cpu["on"])),
        "ratio_wall": statistics.median(a / b for a, b in zip(wall["off"], wall["on"])),
        "pruned_dim_hist": stats["dim_hist"],
    }


# ------------------------------------------------------------------ reporting


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (data, method, ratio): means over seeds, AUC drop paired with the unpruned run of each seed."""
    base = {(r["data"], r["seed"]): r["auc"] for r in runs if r["method"] == "none"}
    keys = sorted({(r["data"], r["method"], r["ratio"]) for r in runs}, key=lambda k: (k[0], k[2], METHODS.index(k[1]) if k[1] in METHODS else -1))
    unpruned_bytes = {}
    for r in runs:
        if r["method"] == "none":
            unpruned_bytes.setdefault(r["data"], []).append(r["value_bytes"])
    out = []
    for data, method, ratio in keys:
        rs = [r for r in runs if (r["data"], r["method"], r["ratio"]) == (data, method, ratio)]
        aucs = [r["auc"] for r in rs]
        drops = [base[(data, r["seed"])] - r["auc"] for r in rs if (data, r["seed"]) in base]
        vb = statistics.mean(r["value_bytes"] for r in rs)
        out.append({
            "data": data, "method": method, "ratio": ratio, "seeds": len(rs),
            "value_bytes": vb,
            "bytes_ratio": statistics.mean(unpruned_bytes[data]) / vb if data in unpruned_bytes else float("nan"),
            "allocated_bytes": statistics.mean(r["allocated_bytes"] for r in rs),
            "auc": statistics.mean(aucs),
            "auc_sd": statistics.stdev(aucs) if len(aucs) > 1 else float("nan"),
            "auc_drop": statistics.mean(drops) if drops else float("nan"),
            "samples_per_s": statistics.median(r["samples_per_s"] for r in rs),
            "mean_dim": _mean_dim(rs[0]["dim_hist"]),
        })
    return out


def _mean_dim(hist: dict) -> float:
    n = sum(hist.values())
    return sum(int(d) * c for d, c in hist.items()) / max(n, 1)


def table(summary: list[dict]) -> str:
    header = ["data", "method", "target", "value MiB", "x smaller", "allocated MiB", "mean dim", "test AUC", "AUC sd", "AUC drop", "samples/s"]
    rows = [
        [s["data"], s["method"], "-" if s["method"] == "none" else f"{s['ratio']}x", s["value_bytes"] / 2**20, s["bytes_ratio"],
         s["allocated_bytes"] / 2**20, s["mean_dim"], f"{s['auc']:.4f}", s["auc_sd"], f"{s['auc_drop']:+.4f}", s["samples_per_s"]]
        for s in summary
    ]
    return markdown_table(header, rows)


def plot(summaries: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summaries), figsize=(6 * len(summaries), 4.5), squeeze=False)
    style = {"prune": ("o-", "frequency x gradient (pruning)"), "frequency": ("s--", "frequency alone"), "uniform": ("^:", "uniform smaller dim")}
    for ax, (data, summary) in zip(axes[0], summaries.items()):
        for method, (fmt, label) in style.items():
            pts = sorted((s["value_bytes"] / 2**20, s["auc"], s["auc_sd"]) for s in summary if s["method"] == method)
            if pts:
                xs, ys, sds = zip(*pts)
                ax.errorbar(xs, ys, yerr=[0 if sd != sd else sd for sd in sds], fmt=fmt, label=label, capsize=3)
        for s in summary:
            if s["method"] == "none":
                ax.axhline(s["auc"], color="gray", lw=0.8)
                ax.plot([s["value_bytes"] / 2**20], [s["auc"]], "k*", ms=12, label="unpruned")
        ax.set_xscale("log")
        ax.set_xlabel("embedding value bytes (MiB, log scale)")
        ax.set_ylabel("test AUC")
        seeds = max(s["seeds"] for s in summary)
        ax.set_title(f"{data} (mean of {seeds} seed{'s' if seeds > 1 else ''})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="synthetic", choices=sorted(DATASETS))
    p.add_argument("--seeds", default="0", help="comma-separated training seeds")
    p.add_argument("--ratios", default=",".join(map(str, RATIOS)))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--throughput-rounds", type=int, default=0, help="timed windows of the stream (0 = skip)")
    p.add_argument("--throughput-steps", type=int, default=50, help="batches per window")
    p.add_argument("--throughput-ratio", type=int, default=4, help="budget of the pruned side: unpruned bytes / this")
    p.add_argument("--skip-sweep", action="store_true", help="only the throughput check")
    p.add_argument("--out", type=Path, help="JSON with every run, the summary and the throughput check")
    p.add_argument("--plot", type=Path, help="PNG of AUC against bytes (with JSON files as arguments: plot those)")
    p.add_argument("results", nargs="*", type=Path, help="earlier --out files to plot and tabulate instead of running")
    a = p.parse_args(argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if a.results:
        results = [json.loads(f.read_text()) for f in a.results]
    else:
        root = Path(tempfile.mkdtemp(prefix="tierec_pruning_"))
        seeds = [int(x) for x in a.seeds.split(",")]
        ratios = tuple(int(x) for x in a.ratios.split(","))
        unknown = [m for m in a.methods.split(",") if m not in METHODS and m not in VARIANTS]
        if unknown:
            p.error(f"unknown --methods {unknown}; choose from {[*METHODS, *VARIANTS]}")
        runs = [] if a.skip_sweep else sweep(a.data, seeds, ratios, tuple(a.methods.split(",")), root, log)
        result = {"data": a.data, "runs": runs, "summary": summarize(runs)}
        if a.throughput_rounds:
            base = next((r for r in runs if r["method"] == "none"), None) or run_one(a.data, "none", 1, 0, root)
            budget = base["value_bytes"] // a.throughput_ratio
            result["throughput"] = step_throughput(a.data, budget, a.throughput_steps, a.throughput_rounds, log)
        shutil.rmtree(root, ignore_errors=True)
        if a.out:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(result, indent=1) + "\n")
        results = [result]
    for r in results:
        print(f"\n### {r['data']}\n")
        if r["summary"]:
            print(table(r["summary"]))
        if "throughput" in r:
            t = r["throughput"]
            print(f"\nthroughput, pruned to {t['budget_bytes'] / 2**20:.2f} MiB vs unpruned ({t['rounds']} windows of "
                  f"{t['steps']} steps): samples per CPU second {t['samples_per_cpu_s']['on']:,.0f} vs "
                  f"{t['samples_per_cpu_s']['off']:,.0f}, median ratio {t['ratio_cpu']:.3f} (CPU), {t['ratio_wall']:.3f} (wall)")
    if a.plot:
        plot({r["data"]: r["summary"] for r in results if r["summary"]}, a.plot)
        print(f"\nplot: {a.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
