"""DENSE: DLRM's dense step with DotInteraction's hand-written backward against autograd's.

Both models are the same DLRM (same seed, same batch); in one of them the
interaction runs the original formulation, ``bmm(x, x^T)`` then ``index_select``,
so autograd differentiates it (a ``scatter_add`` into the Gram matrix and two
``bmm``s). Alternating repeats; prints medians and the paired ratio.

>>> from benchmarks.dense_interaction import main
>>> main(["--batch", "64", "--repeats", "2", "--steps", "1", "--quiet"]) > 0
True
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

import torch
import torch.nn.functional as F
from torch import Tensor

from tierec.config import ModelConfig
from tierec.models import build_model
from tierec.models.layers import DotInteraction


def _autograd_forward(self: DotInteraction, x: Tensor) -> Tensor:
    return torch.bmm(x, x.transpose(1, 2)).flatten(1).index_select(1, self.pair_index)


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--steps", type=int, default=10, help="steps per timed repeat")
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    n_dense = 13
    models = {}
    for name in ("hand-written", "autograd"):
        torch.manual_seed(0)
        m = build_model(ModelConfig(name="dlrm"), n_dense=n_dense, n_sparse=a.tables, dim=a.dim)
        if name == "autograd":
            for mod in m.modules():
                if isinstance(mod, DotInteraction):
                    mod.forward = types.MethodType(_autograd_forward, mod)
        models[name] = (m, torch.optim.Adam(m.parameters(), lr=1e-3))
    g = torch.Generator().manual_seed(1)
    dense = torch.randn(a.batch, n_dense, generator=g)
    emb = torch.randn(a.batch, a.tables, a.dim, generator=g, requires_grad=True)
    labels = (torch.rand(a.batch, generator=g) < 0.3).float()

    def step(m, opt) -> None:
        loss = F.binary_cross_entropy_with_logits(m(dense, emb, None), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for m, opt in models.values():
        step(m, opt)
    times: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(a.repeats):
        for k, (m, opt) in models.items():
            t = time.perf_counter()
            for _ in range(a.steps):
                step(m, opt)
            times[k].append((time.perf_counter() - t) / a.steps)
    paired = statistics.median(o / h for o, h in zip(times["autograd"], times["hand-written"]))
    if not a.quiet:
        for k, v in times.items():
            print(f"{k:13s} dense step median {statistics.median(v) * 1e3:.2f} ms, best {min(v) * 1e3:.2f} ms")
        print(f"autograd / hand-written (paired median): {paired:.3f}")
    return paired


if __name__ == "__main__":
    main()
