"""DENSE STEP: the dense half of a DLRM training step under each precision and compile setting.

Forward, loss, backward (down to the embedding gradient) and Adam on a fixed
batch; the embeddings are a leaf with ``requires_grad`` so their gradient is
computed as in training. Variants alternate within each repeat; prints the
median ms per step, the paired ratio against eager fp32, and for compiled
variants the time of the first (compiling) steps.

    python -m benchmarks.dense_step --model small --batch 4096
    python -m benchmarks.dense_step --model mlperf --batch 2048 --variants fp32,bf16

>>> from benchmarks.dense_step import main
>>> res = main(["--model", "small", "--batch", "64", "--repeats", "2", "--steps", "1", "--variants", "fp32,bf16", "--quiet"])
>>> sorted(res["ms"])
['bf16', 'fp32']
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks.models import MODELS, model_config
from tierec.models import build_model
from tierec.train.precision import DenseStep

N_DENSE = 13
# name -> (precision, compile)
VARIANTS = {
    "fp32": ("fp32", False),
    "bf16": ("bf16", False),
    "fp32-compiled": ("fp32", True),
    "bf16-compiled": ("bf16", True),
}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="small")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--dim", type=int, default=0, help="embedding dim (0 = the model's: 16 small, 128 mlperf)")
    p.add_argument("--steps", type=int, default=10, help="steps per timed repeat")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--variants", default="fp32,bf16")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    mcfg, dim = model_config(a.model, a.dim)
    names = [v for v in a.variants.split(",") if v]
    g = torch.Generator().manual_seed(1)
    dense = torch.randn(a.batch, N_DENSE, generator=g)
    emb = torch.randn(a.batch, a.tables, dim, generator=g).mul_(0.05).requires_grad_(True)
    labels = (torch.rand(a.batch, generator=g) < 0.3).float()
    runs = {}
    first_ms = {}
    for name in names:
        precision, compiled = VARIANTS[name]
        torch.manual_seed(0)
        model = build_model(mcfg, n_dense=N_DENSE, n_sparse=a.tables, dim=dim)
        step = DenseStep(model, precision=precision, compile="on" if compiled else "off")
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def one(step=step, opt=opt) -> None:
            loss = F.binary_cross_entropy_with_logits(step(dense, emb, None).float(), labels)
            opt.zero_grad(set_to_none=True)
            emb.grad = None
            loss.backward()
            opt.step()

        t = time.perf_counter()
        for _ in range(3):  # compile (forward and backward) happens here
            one()
        first_ms[name] = (time.perf_counter() - t) * 1e3
        runs[name] = one
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(a.repeats):
        for k, one in runs.items():
            t = time.perf_counter()
            for _ in range(a.steps):
                one()
            times[k].append((time.perf_counter() - t) / a.steps * 1e3)
    base = names[0]
    res = {
        "model": a.model,
        "batch": a.batch,
        "threads": torch.get_num_threads(),
        "ms": {k: statistics.median(v) for k, v in times.items()},
        "first3_ms": first_ms,
        "paired_vs_" + base: {k: statistics.median(b / x for b, x in zip(times[base], v)) for k, v in times.items()},
    }
    if not a.quiet:
        print(f"model {a.model}, batch {a.batch}, dim {dim}, {torch.get_num_threads()} threads")
        for k in names:
            print(f"{k:14s} {res['ms'][k]:8.2f} ms/step  speedup vs {base} (paired) {res['paired_vs_' + base][k]:.3f}"
                  f"  first 3 steps {first_ms[k]:.0f} ms")
    return res


if __name__ == "__main__":
    main()
