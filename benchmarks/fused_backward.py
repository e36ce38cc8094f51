"""FUSED: the row-parallel reduce + update against pool_backward + the update, in one process.

Two warm tierec collections on the same tables and batches (the engine
benchmark's workload), one forced onto each path, alternating repeats:

    python -m benchmarks.fused_backward --dim 64 --threads 2
    python -m benchmarks.fused_backward --dim 16 --threads 1

>>> from benchmarks.fused_backward import main
>>> main(["--rows", "1000", "--tables", "2", "--batch", "64", "--steps", "2", "--repeats", "2", "--quiet"]) > 0
True
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba  # noqa: E402

from benchmarks.workload import Workload, make_batches, upstream_grad  # noqa: E402
from tierec.batch import SparseFeatures  # noqa: E402
from tierec.config import OptimizerConfig, OptimizerKind  # noqa: E402
from tierec.embedding import EmbeddingCollection, TableConfig  # noqa: E402
from tierec.threads import use_threads  # noqa: E402


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(prog="benchmarks.fused_backward", description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="torch and numba threads (0 = all cores)")
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--steps", type=int, default=20, help="batches per repeat")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    if a.threads:
        use_threads(a.threads)
    w = Workload(tables=a.tables, rows=a.rows, dim=a.dim, batch=a.batch, zipf=a.zipf, steps=a.steps)
    names = w.feature_names()
    sps = [SparseFeatures(tuple(names), b.keys, b.offsets, w.batch) for b in make_batches(w)]
    grad = upstream_grad(w)

    def build(fused: bool) -> EmbeddingCollection:
        opt = OptimizerConfig(kind=OptimizerKind.ROWWISE_ADAGRAD, lr=w.lr, eps=w.eps)
        c = EmbeddingCollection([TableConfig(name=n, dim=w.dim, features=[n], optimizer=opt) for n in names], names)
        for g in c.groups:
            g.fused_reduce_update = (lambda *_: True) if fused else (lambda *_: False)
        return c

    systems = {"fused": build(True), "two-pass": build(False)}
    for c in systems.values():  # warm: every row of the batches inserted
        for sp in sps:
            c(sp).backward(grad)
    wall: dict[str, list[float]] = {k: [] for k in systems}
    cpu: dict[str, list[float]] = {k: [] for k in systems}
    for rep in range(a.repeats):
        for k in list(systems) if rep % 2 == 0 else list(systems)[::-1]:
            c, t0, c0 = systems[k], time.perf_counter(), time.process_time()
            for sp in sps:
                c(sp).backward(grad)
            wall[k].append((time.perf_counter() - t0) / len(sps))
            cpu[k].append((time.process_time() - c0) / len(sps))
    speedup = statistics.median(b / f for f, b in zip(wall["fused"], wall["two-pass"]))
    if not a.quiet:
        for k in systems:
            print(f"dim {a.dim}, {numba.get_num_threads()} thread(s), {k:9s}: {statistics.median(wall[k]) * 1e3:6.2f} ms/step wall, "
                  f"{statistics.median(cpu[k]) * 1e3:6.2f} ms CPU")
        print(f"fused speedup (paired median, wall): {speedup:.3f}; CPU {statistics.median(cpu['two-pass']) / statistics.median(cpu['fused']):.3f}")
    return speedup


if __name__ == "__main__":
    main()
