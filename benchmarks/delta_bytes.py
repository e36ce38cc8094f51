"""Delta vs full checkpoint bytes: 1M rows of dim 16 (row-wise Adagrad), 1% and 10% of rows changed.

Run: PYTHONPATH=. python benchmarks/delta_bytes.py (docs/serving.md, "Delta checkpoints").
"""
import tempfile
import time
from pathlib import Path
import numpy as np, torch
from tierec.batch import SparseFeatures
from tierec.config import EmbeddingConfig
from tierec.embedding import EmbeddingCollection, tables_from_config
from tierec.train.checkpoint import save_checkpoint
from tierec.train.delta import save_delta

N, B = 1_000_000, 100_000
coll = EmbeddingCollection(tables_from_config(EmbeddingConfig(dim=16), ["a"]), ["a"]); coll.train()
def step(ids):
    for lo in range(0, ids.size, B):
        coll(SparseFeatures.one_hot(("a",), torch.from_numpy(ids[lo:lo + B, None]))).sum().backward()
step(np.arange(N))
coll.track_changes()
run = Path(tempfile.mkdtemp())
size = lambda p: sum(f.stat().st_size for f in p.iterdir())
t0 = time.perf_counter(); full = save_checkpoint(run, 0, {}, {}, rows=coll.iter_rows()); tf = time.perf_counter() - t0
print(f"full: {size(full)/2**20:.1f} MiB in {tf:.2f} s ({N} rows)")
rng = np.random.default_rng(0)
for i, frac in enumerate((0.01, 0.10), 1):
    coll.mark_changes()
    step(rng.choice(N, int(N * frac), replace=False).astype(np.int64))
    t0 = time.perf_counter(); ch = coll.changes()
    d = save_delta(run, i, 0, i - 1, {}, {}, rows=coll.changed_rows(ch)); td = time.perf_counter() - t0
    print(f"{frac:.0%} changed: delta {size(d)/2**20:.2f} MiB ({size(d)/size(full):.1%} of full) in {td:.2f} s")
