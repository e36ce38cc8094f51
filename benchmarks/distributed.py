"""Distributed training on one machine: bytes on the wire, step time, overlap, and TorchRec row-wise.

    python -m benchmarks.distributed --out runs/bench/distributed.json

Every configuration is a job of W spawned processes (gloo over loopback) that
trains DLRM on the same pre-generated global batches of Criteo-shaped
synthetic data (26 sparse features, Zipf-skewed ids; rank r takes slice r of
each global batch). After ``--warmup`` steps (which include the first hot-set
refresh), ``--steps`` steps are timed and their traffic counted.

Bytes are what a rank sends to other ranks per step, counted two ways:

- ``tierec``: the sharded collection's own counters (ids + counts, rows,
  gradients, hot-row all-reduce, hot-set refreshes amortised over the steps);
- ``wire``: every collective called through ``torch.distributed``'s Python API
  (which is how tierec and TorchRec call them), with reductions priced as a ring
  (all_reduce sends 2(W-1)/W of the buffer, reduce_scatter (W-1)/W, all_gather
  (W-1) times the input). DDP's gradient all-reduce is issued from C++ and is
  not seen; it is reported apart as ``dense`` = 2(W-1)/W * parameter bytes.

Sections: (1) traffic at ``--traffic-world`` ranks: naive all-to-all of every
id, with per-batch deduplication, with dedup + hot-row replication, and
TorchRec row-wise; (2) step time with 1, 2, 4 processes; (3) the fraction of the
id exchange hidden behind compute: 1 - exposed(overlap on) / exposed(overlap off).

TorchRec's planner offers no row-wise sharding on CPU (it allows data_parallel,
table_wise, column_wise, table_column_wise); a hand-built plan
(``construct_module_sharding_plan`` with ``row_wise()``) does run, and is used here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.report import markdown_table

# ------------------------------------------------------------------ byte counting


class WireCounter:
    """Bytes this rank sends to other ranks through torch.distributed's Python collectives."""

    NAMES = ("all_to_all_single", "all_to_all", "reduce_scatter", "reduce_scatter_tensor", "all_gather",
             "all_gather_into_tensor", "all_gather_single", "all_reduce", "broadcast")

    def __init__(self) -> None:
        self.bytes = 0
        self.calls = 0
        self._saved: dict[str, Any] = {}

    @staticmethod
    def _nbytes(t) -> int:
        return t.numel() * t.element_size()

    def _count(self, name: str, args: tuple, kwargs: dict) -> int:
        group = kwargs.get("group")
        w = dist.get_world_size(group)
        r = dist.get_rank(group)
        if w <= 1:
            return 0
        if name == "all_to_all_single":
            inp = args[1] if len(args) > 1 else kwargs["input"]
            splits = args[3] if len(args) > 3 else kwargs.get("input_split_sizes")
            if splits:
                row = self._nbytes(inp) // max(inp.shape[0], 1) if inp.dim() and inp.shape[0] else 0
                return (sum(splits) - splits[r]) * row
            return self._nbytes(inp) * (w - 1) // w
        if name == "all_to_all":
            ins = args[1] if len(args) > 1 else kwargs["input_tensor_list"]
            return sum(self._nbytes(t) for i, t in enumerate(ins) if i != r)
        if name == "reduce_scatter":
            ins = args[1] if len(args) > 1 else kwargs["input_list"]
            return sum(self._nbytes(t) for i, t in enumerate(ins) if i != r)
        if name == "reduce_scatter_tensor":
            inp = args[1] if len(args) > 1 else kwargs["input"]
            return self._nbytes(inp) * (w - 1) // w
        if name in ("all_gather_into_tensor", "all_gather_single"):
            inp = args[1] if len(args) > 1 else kwargs["input_tensor"]
            return self._nbytes(inp) * (w - 1)
        if name == "all_gather":
            return self._nbytes(args[1] if len(args) > 1 else kwargs["tensor"]) * (w - 1)
        if name == "all_reduce":
            return 2 * (w - 1) * self._nbytes(args[0] if args else kwargs["tensor"]) // w
        if name == "broadcast":
            src = args[1] if len(args) > 1 else kwargs.get("src", 0)
            return self._nbytes(args[0] if args else kwargs["tensor"]) * (w - 1) if src == dist.get_rank() else 0
        return 0

    def install(self) -> WireCounter:
        for name in self.NAMES:
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            self._saved[name] = fn

            def wrapped(*args, _fn=fn, _name=name, **kwargs):
                self.bytes += self._count(_name, args, kwargs)
                self.calls += 1
                return _fn(*args, **kwargs)

            setattr(dist, name, wrapped)
        return self

    def reset(self) -> None:
        self.bytes = 0
        self.calls = 0


# ---------------------------------------------------------------------- workers


def _overrides(a: dict) -> list[str]:
    return [
        f"data.synthetic.cardinality_scale={a['cardinality_scale']}",
        f"data.synthetic.zipf={a['zipf']}",
        f"data.synthetic.train_rows={a['batch'] * (a['warmup'] + a['steps'] + 2)}",
        "data.synthetic.test_rows=1024",
        f"train.batch_size={a['batch']}",
        f"embedding.dim={a['dim']}",
        "train.progress=false",
    ]


def _dense_bytes(model: torch.nn.Module, world: int) -> int:
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    return 2 * (world - 1) * n // world if world > 1 else 0


def _finish(ctx, out_path: str, record: dict[str, Any]) -> None:
    """Gather every rank's record; rank 0 writes them."""
    records = [None] * ctx.world_size
    if ctx.is_distributed:
        dist.all_gather_object(records, record, group=ctx.dense_group)
    else:
        records = [record]
    if ctx.is_main:
        Path(out_path).write_text(json.dumps(records))


def tierec_worker(ctx, a: dict, variant: dict, out_path: str) -> None:
    """Train tierec (the one trainer, on W processes) and time the steps."""
    from tierec.config import load_config
    from tierec.data import open_source
    from tierec.distributed.parallelize import sharded_collections
    from tierec.train.pipeline import TrainPipeline
    from tierec.train.trainer import Trainer

    counter = WireCounter().install()
    if variant.get("threads"):
        from tierec.threads import use_threads

        use_threads(variant["threads"])
    cfg = load_config(None, _overrides(a) + variant.get("set", []))
    source = open_source(cfg.data, "train", cfg.train.batch_size)
    batches = list(islice(iter(source), a["warmup"] + a["steps"] + 1))
    run = tempfile.TemporaryDirectory(prefix="tierec-bench-run-")  # removed when the worker ends
    trainer = Trainer(cfg, run.name, ctx=ctx)
    parts = trainer._build(source)
    colls = sharded_collections(parts)
    pipe = TrainPipeline(parts, trainer.job, cfg)
    times, cpu = [], []
    for i in range(a["warmup"] + a["steps"]):
        if i == a["warmup"]:
            for c in colls:
                c.traffic.reset()
            counter.reset()
        if ctx.is_distributed:
            dist.barrier(group=ctx.dense_group)  # each step timed from a common start
        t0, c0 = time.perf_counter(), time.process_time()
        pipe.step(batches[i], batches[i + 1])  # with dist.overlap the next batch's ids go out during this step
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    pipe.close()
    run.cleanup()
    steps = a["steps"]
    kinds: dict[str, float] = {}
    exposed = 0.0
    for c in colls:
        for k, v in c.traffic.bytes_sent.items():
            kinds[k] = kinds.get(k, 0.0) + v / steps
        exposed += c.traffic.seconds.get("ids", 0.0) / steps
    record = {
        "step_s": times[a["warmup"] :],
        "cpu_s": cpu[a["warmup"] :],
        "bytes_by_kind": kinds,
        "bytes_tierec": sum(kinds.values()),
        "bytes_wire": counter.bytes / steps,
        "bytes_dense": _dense_bytes(parts.model, ctx.world_size),
        "ids_exposed_s": exposed,
        "hot_rows": sum(c.hot_rows() for c in colls),
    }
    _finish(ctx, out_path, record)


def _kjt(batch, keys: list[str], cards: list[int]):
    from torchrec import KeyedJaggedTensor

    sp = batch.sparse
    vals = []
    for f, card in enumerate(cards):
        lo, hi = sp.feature_span(f)
        vals.append(sp.values[lo:hi] % card)  # hashed ids -> rows of a fixed-size table
    lengths = sp.offsets[1:] - sp.offsets[:-1]
    return KeyedJaggedTensor(keys=keys, values=torch.cat(vals), lengths=lengths)


def torchrec_worker(ctx, a: dict, variant: dict, out_path: str) -> None:
    """TorchRec EmbeddingBagCollection, row-wise sharded (hand-built plan), fused row-wise Adagrad, DLRM on top."""
    import torch.nn.functional as F
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
    from torchrec.distributed.types import ShardingPlan

    from tierec.config import load_config
    from tierec.data import open_source
    from tierec.distributed.data import slice_batch
    from tierec.models import build_model

    if not dist.is_initialized():  # one process: TorchRec still wants a (one-rank) process group
        from tierec.distributed.launch import free_port

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    counter = WireCounter().install()
    cfg = load_config(None, _overrides(a))
    source = open_source(cfg.data, "train", cfg.train.batch_size)
    batches = list(islice(iter(source), a["warmup"] + a["steps"]))
    keys = list(source.feature_names)
    cards = [max(int(c), 2) for c in _cardinalities(cfg)]
    w, r = ctx.world_size, ctx.rank
    local = [slice_batch(b, w, r) for b in batches]
    kjts = [_kjt(b, keys, cards) for b in local]
    bound = 1.0 / cfg.embedding.dim**0.5
    tables = [EmbeddingBagConfig(name=f"t_{k}", embedding_dim=cfg.embedding.dim, num_embeddings=c, feature_names=[k],
                                 weight_init_min=-bound, weight_init_max=bound) for k, c in zip(keys, cards)]

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
            self.dense = build_model(cfg.model, n_dense=source.n_dense, n_sparse=len(keys), dim=cfg.embedding.dim)

        def forward(self, dense, kjt):
            emb = self.ebc(kjt).values().view(dense.shape[0], len(keys), -1)
            return self.dense(dense, emb, None)

    torch.manual_seed(0)
    model = Model()
    opt_params = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": cfg.embedding.optimizer.lr}
    sharder = EmbeddingBagCollectionSharder(fused_params=opt_params)
    plan = ShardingPlan({"ebc": construct_module_sharding_plan(model.ebc, {t.name: row_wise() for t in tables},
                                                              world_size=w, device_type="cpu", sharder=sharder)})
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    dense_params = [p for n, p in dmp.named_parameters() if "ebc" not in n]
    opt = torch.optim.Adam(dense_params, lr=cfg.train.dense_lr)
    times, cpu = [], []
    for i in range(a["warmup"] + a["steps"]):
        if i == a["warmup"]:
            counter.reset()
        if ctx.is_distributed:
            dist.barrier(group=ctx.dense_group)
        t0, c0 = time.perf_counter(), time.process_time()
        logits = dmp(local[i].dense, kjts[i])
        loss = F.binary_cross_entropy_with_logits(logits, local[i].labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # the sharded tables are updated in the backward (fused optimizer)
        opt.step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    record = {
        "step_s": times[a["warmup"] :],
        "cpu_s": cpu[a["warmup"] :],
        "bytes_by_kind": {},
        "bytes_tierec": float("nan"),
        "bytes_wire": counter.bytes / a["steps"],
        "bytes_dense": _dense_bytes(model.dense, w),
        "ids_exposed_s": float("nan"),
        "hot_rows": 0,
    }
    _finish(ctx, out_path, record)


def _cardinalities(cfg) -> list[int]:
    from tierec.data import cardinalities

    return list(cardinalities(cfg.data.synthetic))


# ------------------------------------------------------------------------ driver


def run_job(worker, world: int, a: dict, variant: dict) -> dict[str, Any]:
    from tierec.config import DistConfig
    from tierec.distributed.launch import spawn

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        spawn(worker, world, (a, variant, str(out)), cfg=DistConfig(timeout_s=600), timeout_s=3600)
        records = json.loads(out.read_text())
    steps = [statistics.median(r["step_s"]) for r in records]
    return {
        "name": variant["name"],
        "world": world,
        "step_s": max(steps),  # the job moves at its slowest rank's pace
        "cpu_s": sum(statistics.median(r["cpu_s"]) for r in records),  # CPU seconds per step, all ranks together
        "bytes_tierec": statistics.mean(r["bytes_tierec"] for r in records),
        "bytes_wire": statistics.mean(r["bytes_wire"] for r in records),
        "bytes_wire_max": max(r["bytes_wire"] for r in records),
        "bytes_dense": records[0]["bytes_dense"],
        "bytes_by_kind": {k: statistics.mean(r["bytes_by_kind"].get(k, 0.0) for r in records)
                          for k in sorted({k for r in records for k in r["bytes_by_kind"]})},
        "ids_exposed_s": statistics.mean(r["ids_exposed_s"] for r in records),
        "hot_rows": records[0]["hot_rows"],
        "job_wall_s": time.perf_counter() - t0,
        "load_avg": os.getloadavg()[0],
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks.distributed", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=4096, help="global batch (split between the ranks)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--cardinality-scale", type=float, default=0.05, help="Criteo Kaggle cardinalities times this")
    p.add_argument("--zipf", type=float, default=1.3)
    p.add_argument("--warmup", type=int, default=12)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--hot-rows", type=int, default=4096, help="dist.hot_rows for the replicated runs")
    p.add_argument("--hot-refresh", type=int, default=10, help="dist.hot_refresh_every")
    p.add_argument("--traffic-world", type=int, default=4)
    p.add_argument("--worlds", default="1,2,4", help="process counts for the step-time section")
    p.add_argument("--sections", default="traffic,time,overlap,torchrec")
    p.add_argument("--repeats", type=int, default=3, help="rounds of the timed jobs (medians reported)")
    p.add_argument("--out", default="runs/bench/distributed.json")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    a = {k: getattr(args, k) for k in ("batch", "dim", "cardinality_scale", "zipf", "warmup", "steps")}
    hot = [f"dist.hot_rows={args.hot_rows}", f"dist.hot_refresh_every={args.hot_refresh}"]
    sections = set(args.sections.split(","))
    worlds = [int(x) for x in args.worlds.split(",")]
    tw = args.traffic_world
    results: dict[str, Any] = {"args": vars(args), "machine": {
        "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default: active spinning)")}}
    rows: list[dict] = []

    def job(worker, world, variant):
        try:
            r = run_job(worker, world, a, variant)
        except Exception as e:  # reported, never silently skipped
            rows.append({"name": variant["name"], "world": world, "error": f"{type(e).__name__}: {e}"[:300]})
            return
        rows.append(r)
        print(f"  {r['name']:<24} W={world}  step {r['step_s'] * 1e3:8.1f} ms  bytes/rank/step {r['bytes_tierec']:>12,.0f} "
              f"(wire {r['bytes_wire']:>12,.0f})  ids exposed {r['ids_exposed_s'] * 1e3:.2f} ms  load {r['load_avg']:.1f}",
              file=sys.stderr, flush=True)

    if "traffic" in sections:  # bytes do not depend on timing: once is enough
        for name, s in (("naive", ["dist.dedupe=false"]), ("dedup", []), ("dedup+hot", hot)):
            job(tierec_worker, tw, {"name": name, "set": s})
    timed = []
    if "time" in sections:
        timed += [(tierec_worker, w, {"name": "tierec (1 process)" if w == 1 else "tierec sharded", "set": []})
                  for w in worlds]
        if 1 in worlds:
            timed.append((tierec_worker, 1, {"name": "tierec (1 process, 1 thread)", "set": [], "threads": 1}))
    if "overlap" in sections:
        timed += [(tierec_worker, w, {"name": f"overlap={'on' if ov else 'off'}",
                                      "set": hot + [f"dist.overlap={str(ov).lower()}"]})
                  for w in worlds if w > 1 for ov in (False, True)]
    if "torchrec" in sections:
        timed += [(torchrec_worker, w, {"name": "torchrec-rw"}) for w in worlds]
    # Other processes share the machine: every repeat runs each job once, in a rotated
    # order, and the medians over repeats are reported.
    for rep in range(args.repeats):
        k = rep % max(len(timed), 1)
        for worker, w, variant in timed[k:] + timed[:k]:
            job(worker, w, {**variant, "repeat": rep})
    rows = _median_over_repeats(rows)
    results["rows"] = rows
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(report(results))
    return 0


def _median_over_repeats(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["name"], r["world"]), []).append(r)
    out = []
    for rs in groups.values():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            out.append(rs[0])
            continue
        m = dict(ok[0])
        for key in ("step_s", "cpu_s", "ids_exposed_s", "load_avg"):
            m[key] = statistics.median(r[key] for r in ok)
        m["step_s_all"] = [r["step_s"] for r in ok]
        m["repeats"] = len(ok)
        out.append(m)
    return out


def report(results: dict[str, Any]) -> str:
    """Markdown tables of a results file."""
    rows = [r for r in results["rows"] if "error" not in r]
    kib = 1 / 1024
    out = []
    tw = results["args"]["traffic_world"]
    traffic = [r for r in rows if r["world"] == tw and r["name"] in ("naive", "dedup", "dedup+hot", "torchrec-rw")]
    if traffic:
        naive = next((r["bytes_wire"] for r in traffic if r["name"] == "naive"), float("nan"))
        table = []
        for r in traffic:
            k = r["bytes_by_kind"]
            table.append([r["name"], r["bytes_wire"] * kib, r["bytes_wire_max"] * kib,
                          naive / r["bytes_wire"] if r["bytes_wire"] else float("nan"),
                          (k.get("ids", 0) + k.get("counts", 0)) * kib, k.get("rows", 0) * kib, k.get("grads", 0) * kib,
                          k.get("hot", 0) * kib, k.get("refresh", 0) * kib, r["bytes_dense"] * kib])
        out.append(f"Bytes sent per step per rank, {tw} processes (KiB; sparse part, plus DDP's dense all-reduce apart)\n")
        out.append(markdown_table(["variant", "sparse, mean rank", "sparse, busiest rank", "naive / this", "ids",
                                   "rows", "grads", "hot all-reduce", "refresh", "dense (DDP)"], table))
    timing = [r for r in rows if r["name"].startswith(("tierec (1 process", "tierec sharded", "torchrec-rw"))]
    if timing:
        out.append("\nStep time (median ms; global batch fixed, split between the processes; CPU ms summed over "
                   "the processes; 1-minute load average)\n")
        out.append(markdown_table(
            ["system", "processes", "step ms (median)", "each repeat", "samples/s", "CPU ms / step", "load"],
            [[r["name"], r["world"], r["step_s"] * 1e3, " / ".join(f"{x * 1e3:.0f}" for x in r.get("step_s_all", [r["step_s"]])),
              results["args"]["batch"] / r["step_s"], r.get("cpu_s", float("nan")) * 1e3, r["load_avg"]]
             for r in sorted(timing, key=lambda r: (r["world"], r["name"]))]))
    ov = [r for r in rows if r["name"].startswith("overlap=")]
    if ov:
        table = []
        for w in sorted({r["world"] for r in ov}):
            off = next(r for r in ov if r["world"] == w and r["name"] == "overlap=off")
            on = next(r for r in ov if r["world"] == w and r["name"] == "overlap=on")
            hidden = 1 - on["ids_exposed_s"] / off["ids_exposed_s"] if off["ids_exposed_s"] else float("nan")
            table.append([w, off["ids_exposed_s"] * 1e3, on["ids_exposed_s"] * 1e3, hidden, off["step_s"] * 1e3, on["step_s"] * 1e3])
        out.append("\nId exchange exposed per step (ms) and the fraction hidden by overlap\n")
        out.append(markdown_table(["processes", "exposed, overlap off", "exposed, overlap on", "hidden", "step ms off",
                                   "step ms on"], table))
    errors = [r for r in results["rows"] if "error" in r]
    for r in errors:
        out.append(f"\n{r['name']} W={r['world']}: did not run: {r['error']}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
