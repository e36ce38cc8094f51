"""Run the comparisons side by side and print markdown tables of medians and ratios.

    python -m benchmarks.run --which engine --tables 26 --rows 1000000 --dim 16 \\
        --batch 4096 --zipf 1.1 --hot 1 --steps 30 --repeats 5 --out bench.json

``--which`` picks engine, e2e, memory, profile (tierec's engine stage times), or
all. A peer that cannot be imported is listed as missing, with its error.

>>> from benchmarks.run import main
>>> main(["--which", "engine", "--tables", "2", "--rows", "100", "--dim", "4", "--batch", "8",
...       "--steps", "2", "--repeats", "2", "--systems", "tierec,floor", "--quiet"])
0
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from benchmarks import OMP_WAIT_POLICY_APPLIED
from benchmarks.systems import ENGINE_SYSTEMS
from benchmarks.workload import Workload

WHICH = ("engine", "e2e", "memory", "profile", "all")
E2E_SYSTEMS = ("tierec", "tierec-fp32", "tierec-ahead", "torchrec", "torch")


def _available_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 8.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--which", choices=WHICH, default="engine")
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows per table (id range)")
    p.add_argument("--dim", type=int, default=0, help="embedding dim (0 = 16; 128 with --model mlperf)")
    p.add_argument("--model", choices=["small", "mlperf"], default="small",
                   help="e2e dense model: tierec's default DLRM, or DLRM with MLPerf's dims (benchmarks.models)")
    p.add_argument("--no-keep-heap", action="store_true",
                   help="leave glibc's malloc thresholds as they are (by default the run applies "
                   "tierec.train.allocator.keep_heap, as `tierec train` does, process-wide: every system gets it)")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the ids; 0 = uniform")
    p.add_argument("--hot", type=int, default=1, help="ids per sample per feature (1 = one-hot)")
    p.add_argument("--optimizer", default="rowwise_adagrad", choices=["rowwise_adagrad", "adagrad"],
                   help="sparse optimizer: row-wise Adagrad (the one every peer fuses), or element-wise "
                   "Adagrad (e2e only: the one plain PyTorch has, so all three systems run the same algorithm)")
    p.add_argument("--lr", type=float, default=0.05, help="sparse learning rate")
    p.add_argument("--steps", type=int, default=30, help="steps (batches) per timed repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--systems", default="", help=f"comma list; engine: {','.join(ENGINE_SYSTEMS)}; e2e: {','.join(E2E_SYSTEMS)}")
    p.add_argument("--mem-gb", type=float, default=0.0, help="memory for the systems of one group (default: 60%% of available)")
    p.add_argument("--test-batches", type=int, default=16, help="e2e: held-out batches for AUC")
    p.add_argument("--data", choices=["planted", "tierec"], default="planted",
                   help="e2e data: the suite's planted generator, or tierec.data's synthetic generator")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch and numba threads (0 = all cores)")
    p.add_argument("--out", default="", help="write the results as JSON here")
    p.add_argument("--quiet", action="store_true", help="do not print the tables")
    return p


def machine() -> dict:
    import numba
    import torch

    return {
        "cpus": os.cpu_count(),
        "cpu": _cpu_model(),
        "mem_available_gib": round(_available_gib(), 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numba": numba.__version__,
        "numba_threads": numba.get_num_threads(),
        "loadavg": os.getloadavg(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset: OpenMP default, spin a while then sleep)"),
        "omp_wait_policy_in_force": bool(OMP_WAIT_POLICY_APPLIED),
        "cpu_flags_bf16": sorted(_bf16_flags()),
    }


def _bf16_flags() -> set[str]:
    from tierec.train.precision import BF16_CPU_FLAGS, cpu_flags

    return cpu_flags() & set(BF16_CPU_FLAGS)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.threads:
        from tierec.threads import use_threads

        use_threads(args.threads)
    if not args.no_keep_heap:
        from tierec.train.allocator import keep_heap

        keep_heap()
    from benchmarks.models import model_config

    w = Workload(
        tables=args.tables,
        rows=args.rows,
        dim=model_config(args.model, args.dim)[1],
        model=args.model,
        batch=args.batch,
        zipf=args.zipf,
        hot=args.hot,
        steps=args.steps,
        lr=args.lr,
        optimizer=args.optimizer,
        seed=args.seed,
    )
    budget = int((args.mem_gb or 0.6 * _available_gib()) * 2**30)
    which = ("engine", "e2e", "memory") if args.which == "all" else (args.which,)
    if w.optimizer != "rowwise_adagrad" and which != ("e2e",):
        print(f"error: --optimizer {w.optimizer} is for --which e2e; the engine, memory and profile runs "
              "compare row-wise Adagrad", file=sys.stderr)
        return 2
    chosen = [s for s in args.systems.split(",") if s]
    out: dict = {"argv": sys.argv[1:] if argv is None else list(argv), "machine": machine(), "results": {}}
    out["machine"]["keep_heap"] = not args.no_keep_heap
    texts = []
    t0 = time.perf_counter()
    for kind in which:
        if kind == "engine":
            from benchmarks.engine import engine_markdown, run_engine

            res = run_engine(w, chosen or list(ENGINE_SYSTEMS), args.repeats, budget)
            texts.append(engine_markdown(res))
        elif kind == "e2e":
            from benchmarks.e2e import e2e_markdown, run_e2e

            res = run_e2e(w, chosen or list(E2E_SYSTEMS), args.repeats, args.test_batches, args.data)
            texts.append(e2e_markdown(res))
        elif kind == "memory":
            from benchmarks.memory import memory_markdown, run_memory

            res = run_memory(w, [s for s in chosen or ENGINE_SYSTEMS if s not in ("tierec-cold", "floor")])
            texts.append(memory_markdown(res))
        else:
            from benchmarks.profile_engine import profile_markdown, run_profile

            res = run_profile(w, args.repeats)
            texts.append(profile_markdown(res))
        out["results"][kind] = res
        if not args.quiet:
            print(texts[-1] + "\n", flush=True)
    out["seconds"] = time.perf_counter() - t0
    out["markdown"] = "\n\n".join(texts)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
