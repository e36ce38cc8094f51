"""Hierarchical training on 4 processes: bytes inside and across groups, test AUC, step time over a slow link.

    python -m benchmarks.hierarchical --out runs/bench/hierarchical.json          # bytes and AUC (spawned, loopback)
    python -m benchmarks.hierarchical --link 100mbit --out runs/bench/hier-100m.json  # step time, 2 namespaces

Every variant trains DLRM on the same global batches of Criteo-shaped
synthetic data (rank r takes slice r), then scores the test split:

- ``flat``: today's run, every table sharded over the 4 ranks;
- ``2x2`` meshes (``dist.group_size=2``): ``gradients`` and ``average`` with
  ``sync_every`` 1, 4, 16, each with every codec.

Bytes per step per rank are tierec's own counters: inside the group
(id / row / gradient all-to-alls, the dense part's in-group all-reduce and
all-gather) and across groups (``cross/...``). For ``flat`` the bytes that
cross between the two halves of the ranks (ranks 0-1 and 2-3, the two
"machines") are counted per destination on the all-to-alls' split sizes; DDP's
all-reduce (a ring 0-1-2-3-0, of which 2 of the 4 links cross halves) is priced
as half of each rank's ring bytes crossing.

With ``--link RATE`` the variants run as a real 2-node torchrun (2 processes a
node) between two network namespaces joined by a tbf-limited veth pair
(``benchmarks/netns_torchrun.sh``), and the step time is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

CODECS = ["none", "fp16", "bf16", "int8"]


def variants(sync: list[int], codecs: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": "flat", "set": ["dist.group_size=4"]}]  # 4: flat also over 2 nodes
    for c in codecs:
        out.append({"name": f"2x2 gradients {c}", "set": ["dist.group_size=2", f"dist.compress={c}"]})
    for k in sync:
        for c in codecs:
            out.append({"name": f"2x2 average/{k} {c}",
                        "set": ["dist.group_size=2", "dist.cross_group=average", f"dist.sync_every={k}", f"dist.compress={c}"]})
    return out


def _overrides(a: dict) -> list[str]:
    return [
        f"data.synthetic.cardinality_scale={a['cardinality_scale']}",
        f"data.synthetic.train_rows={a['batch'] * a['steps']}",
        f"data.synthetic.test_rows={a['test_rows']}",
        f"train.batch_size={a['batch']}",
        f"embedding.dim={a['dim']}",
        "train.progress=false",
    ]


class HalfCounter:
    """Bytes each all-to-all of the flat run sends to ranks of the other half (ranks < W/2 vs >= W/2)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world, self.bytes = rank, world, 0
        self._orig = dist.all_to_all_single

    def install(self) -> HalfCounter:
        def counted(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
            if group is None or dist.get_world_size(group) == self.world:
                rows = input.shape[0] if input.dim() else 0
                splits = input_split_sizes or [rows // self.world] * self.world
                per_row = input.numel() * input.element_size() // max(rows, 1)
                half = self.world // 2
                mine = self.rank < half
                self.bytes += sum(n * per_row for r, n in enumerate(splits) if (r < half) != mine)
            return self._orig(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)

        dist.all_to_all_single = counted
        return self


def _auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    from tierec.train.metrics import EvalAccumulator

    acc = EvalAccumulator()
    acc.update(scores, labels)
    return float(acc.compute()["auc"])


def train_and_measure(ctx, a: dict, variant: dict) -> dict[str, Any]:
    """Build, train ``a['steps']`` steps (timed after ``a['warmup']``), evaluate; this rank's record."""
    from tierec.config import load_config
    from tierec.data import open_source
    from tierec.distributed.data import loss_scale, slice_batch
    from tierec.distributed.hierarchical import Hierarchical
    from tierec.distributed.sharded import ShardedEmbeddingCollection
    from tierec.train.components import Components
    from torch.nn.parallel import DistributedDataParallel

    cfg = load_config(None, _overrides(a) + variant["set"])
    torch.manual_seed(cfg.train.seed)
    source = open_source(cfg.data, "train", cfg.train.batch_size)
    parts = Components.build(cfg, source.feature_names, source.n_dense)
    h = Hierarchical.build(ctx, cfg.dist)
    halves = HalfCounter(ctx.rank, ctx.world_size).install() if h is None else None
    if h is None:
        colls = [ShardedEmbeddingCollection(parts.embeddings, ctx, cfg.dist)]
        parts.ddp = DistributedDataParallel(parts.model, process_group=ctx.dense_group, forward_sync_buffers=False)
    else:
        colls = [h.shard_collection(parts.embeddings)]
        parts.ddp = h.wrap_dense(parts.model)
    parts.embeddings = colls[0]
    if parts.wide is not None:
        raise SystemExit("benchmarks.hierarchical runs models without wide tables (dlrm, dcnv2)")
    w, times = ctx.world_size, []
    for i, batch in enumerate(islice(iter(source), a["steps"])):
        if i == a["warmup"]:
            for c in colls:
                c.traffic.reset()
            if h is not None:
                h.traffic.reset()
            if halves is not None:
                halves.bytes = 0
        dist.barrier()
        t0 = time.perf_counter()
        parts.train(True)
        local = slice_batch(batch, w, ctx.rank)
        loss_sum = F.binary_cross_entropy_with_logits(parts.forward(local), local.labels, reduction="sum")
        parts.optimizer.zero_grad(set_to_none=True)
        (loss_sum * loss_scale(batch.size, w)).backward()
        parts.optimizer.step()
        if h is not None:
            h.after_step()
        times.append(time.perf_counter() - t0)
    timed = max(a["steps"] - a["warmup"], 1)
    counted = [dict(c.traffic.bytes_sent) for c in colls], (dict(h.traffic.bytes_sent) if h is not None else {})
    if h is not None:
        h.sync_now()  # the replicas together for the evaluation (not counted: a run syncs at its end once)
    # test AUC: each rank scores its slice of every test batch; every rank gathers all
    parts.train(False)
    scores, labels = [], []
    with torch.no_grad():
        for batch in open_source(cfg.data, "test", cfg.train.batch_size):
            local = slice_batch(batch, w, ctx.rank)
            every: list[Any] = [None] * w
            dist.all_gather_object(every, parts.forward(local).cpu())
            scores.append(torch.cat(every))
            labels.append(batch.labels)
    for c in colls:
        c.close()
    sparse, dense = counted
    inside = sum(v for c in sparse for k, v in c.items() if not k.startswith("cross/")) / timed
    across = sum(v for c in sparse for k, v in c.items() if k.startswith("cross/")) / timed
    n_dense = sum(p.numel() for p in parts.model.parameters()) * 4
    if h is None:  # DDP's ring all-reduce over the job: 2(W-1)/W of the buffer per rank, half of it across halves
        ring = 2 * (w - 1) * n_dense / w
        dense_inside, dense_across = ring / 2, ring / 2
        across_halves = halves.bytes / timed + dense_across
        inside_halves = inside - halves.bytes / timed + dense_inside
    else:
        dense_inside = sum(v for k, v in dense.items() if not k.startswith("cross/")) / timed
        dense_across = sum(v for k, v in dense.items() if k.startswith("cross/")) / timed
        across_halves, inside_halves = across + dense_across, inside + dense_inside
    return {
        "step_s": times[a["warmup"]:],
        "bytes_inside": inside_halves,
        "bytes_across": across_halves,
        "bytes_sparse_inside": inside if h is not None else inside - halves.bytes / timed,
        "bytes_dense_across": dense_across,
        "auc": _auc(torch.cat(scores), torch.cat(labels)),
    }


def spawn_worker(ctx, a: dict, variant: dict, out: str) -> None:
    rec = train_and_measure(ctx, a, variant)
    every: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(every, rec)
    if ctx.rank == 0:
        Path(out).write_text(json.dumps(every))


def summarise(name: str, records: list[dict]) -> dict[str, Any]:
    return {
        "name": name,
        "step_ms": 1000 * max(statistics.median(r["step_s"]) for r in records),
        "bytes_inside": statistics.mean(r["bytes_inside"] for r in records),
        "bytes_across": statistics.mean(r["bytes_across"] for r in records),
        "bytes_dense_across": statistics.mean(r["bytes_dense_across"] for r in records),
        "auc": records[0]["auc"],
    }


def run_spawned(a: dict, variant: dict) -> dict[str, Any]:
    from tierec.config import DistConfig
    from tierec.distributed.launch import spawn

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        spawn(spawn_worker, 4, (a, variant, str(out)), cfg=DistConfig(timeout_s=600), timeout_s=1800)
        return summarise(variant["name"], json.loads(out.read_text()))


def torchrun_main(argv: list[str]) -> int:
    """A rank of the 2-node job (``--rank-of A_JSON VARIANT_JSON OUT``), started by netns_torchrun.sh."""
    from tierec.config import DistConfig
    from tierec.distributed.context import init_distributed

    a, variant, out = json.loads(argv[0]), json.loads(argv[1]), argv[2]
    ctx = init_distributed(DistConfig(timeout_s=600), threads=1)
    spawn_worker(ctx, a, variant, out)
    ctx.close()
    return 0


def run_two_nodes(a: dict, variant: dict, link: str) -> dict[str, Any]:
    from benchmarks.netns import run_two_nodes as two_nodes

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        args = ["--rank-of", json.dumps(a), json.dumps(variant), str(out)]
        done = two_nodes(link, 2, args, env={"NETNS_MODULE": "benchmarks.hierarchical",
                                             "PYTHONPATH": str(Path(__file__).resolve().parents[1])}, timeout_s=1800)
        if done.returncode:
            raise RuntimeError(f"{variant['name']} over {link} failed:\n{done.stderr[-2000:]}")
        return summarise(variant["name"], json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--rank-of":
        return torchrun_main(argv[1:])
    p = argparse.ArgumentParser(prog="benchmarks.hierarchical", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--cardinality-scale", type=float, default=0.01)
    p.add_argument("--test-rows", type=int, default=20000)
    p.add_argument("--sync", type=int, nargs="*", default=[1, 4, 16])
    p.add_argument("--codecs", nargs="*", default=CODECS)
    p.add_argument("--only", nargs="*", default=None, help="variant names to run (default all)")
    p.add_argument("--link", default="", help="a tc rate (1gbit, 100mbit): run as 2 nodes over a limited link")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    a = {"steps": args.steps, "warmup": args.warmup, "batch": args.batch, "dim": args.dim,
         "cardinality_scale": args.cardinality_scale, "test_rows": args.test_rows}
    rows = []
    for v in variants(args.sync, args.codecs):
        if args.only and v["name"] not in args.only:
            continue
        t0 = time.perf_counter()
        row = run_two_nodes(a, v, args.link) if args.link else run_spawned(a, v)
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"args": a, "link": args.link, "host": platform.node(), "cpu": _cpu_model(), "rows": rows,
              "load_avg": os.getloadavg()[0]}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


def _cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "")


if __name__ == "__main__":
    raise SystemExit(main())
