"""A tiered table 4x its memory budget is checkpointed and loaded, each in a fresh process, within the budget.

Each child measures its peak resident memory (VmHWM, reset through
/proc/self/clear_refs after imports and compilation) while it saves or loads,
and checks it against the store's own RAM (``nbytes``: fast tier, directory,
disk bookkeeping) plus the stated bookkeeping of a streamed checkpoint: a few
copies of one chunk of records. A save or load that held the table (64 MiB)
would exceed that bound by far.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BUDGET = 16 << 20  # bytes of fast tier (no host tier): the memory budget
DIM = 64  # row-wise Adagrad: 65 floats = 260 B a row
ROWS = 4 * BUDGET // 260  # the table: 4x the budget
CHUNK = 2 << 20  # bytes of records per checkpoint chunk
COPIES = 8  # chunk-sized buffers a save or load holds at once, at most (tier reads, records, tensors, file buffer)
SLACK = 8 << 20  # allocator and interpreter noise

CHILD = r"""
import json, sys
import numpy as np, torch
from pathlib import Path
from tierec.embedding.table import TableConfig
from tierec.store.tiered_group import TieredGroup
from tierec.store.spec import TierSpec
from tierec.train.checkpoint import Checkpoint, save_checkpoint
from tierec.embedding.storage import record_chunks

mode, run, disk, budget, dim, n_rows, chunk = sys.argv[1], Path(sys.argv[2]), sys.argv[3], *map(int, sys.argv[4:8])

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

def group(cache=budget):
    spec = TierSpec(cache_bytes=cache, host_bytes=0, disk_dir=disk)
    return TieredGroup([TableConfig(name="t", dim=dim, features=["f"])], spec, seed=3)

def digest(g):
    out = np.zeros(3)
    for rec in record_chunks(g, 0, chunk // 260):
        ids = rec["ids"].numpy()
        w = 1.0 + (ids % 997)
        out += [ids.sum(), (rec["weights"].double().sum(1).numpy() * w).sum(), (rec["opt.sum"].double().numpy() * w).sum()]
    return out.tolist()

def save(g, path, step):
    rows = (("emb/t", rec) for rec in record_chunks(g, 0, chunk // (4 * g.record_width)))
    save_checkpoint(path, step, {}, {}, rows=rows)

def load(g, path):
    for _, rec in Checkpoint(path).rows():
        g.write_records(0, rec)

# compile and touch every path once on a tiny table (its fast tier 250 rows: most of its 1,000 go to disk and
# are read back by the save, so the disk reads' kernels compile here too), then measure from here
warm = group(1 << 16)
for lo in range(0, 1000, 200):
    warm.lookup(np.arange(lo, lo + 200, dtype=np.int64), np.zeros(200, dtype=np.int32), insert=True)
save(warm, run / "warm", 1)
load(group(1 << 16), run / "warm")
base = status("VmRSS")
g = group()
if mode == "save":
    for lo in range(0, n_rows, 8192):
        ids = np.arange(lo, min(lo + 8192, n_rows), dtype=np.int64) * 7919
        slots = g.lookup(ids, np.zeros(ids.size, dtype=np.int32), insert=True)
        g.update(slots, torch.full((ids.size, dim), 0.01))  # rows and optimizer state differ from their init
before = status("VmRSS") - base
open("/proc/self/clear_refs", "w").write("5")
if mode == "save":
    save(g, run / "ckpt", 2)
else:
    load(g, run / "ckpt")
peak = status("VmHWM") - base
stats = g.stats()["t"]
print(json.dumps({"peak": peak, "before": before, "nbytes": g.nbytes(), "rows": g.num_rows, "disk_rows": stats["rows_disk"],
                  "digest": digest(g)}))
"""


def _child(mode: str, tmp: Path) -> dict:
    args = [sys.executable, "-c", CHILD, mode, str(tmp), str(tmp), str(BUDGET), str(DIM), str(ROWS), str(CHUNK)]
    out = subprocess.run(args, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to reset peak RSS")
def test_table_4x_budget_saves_and_loads_within_budget(tmp_path: Path) -> None:
    saved = _child("save", tmp_path)
    loaded = _child("load", tmp_path)
    table = ROWS * 4 * (DIM + 1)
    assert saved["rows"] == loaded["rows"] == ROWS
    assert saved["disk_rows"] >= ROWS * 3 // 4 and loaded["disk_rows"] == ROWS  # most rows on disk
    assert loaded["digest"] == saved["digest"]  # every row, weights and optimizer state, came back
    bound = COPIES * CHUNK + SLACK
    assert bound < table // 2  # the bound would not hold half the table
    # saving adds a bounded working set to the trained store (fast tier full, directory, disk bookkeeping)
    assert saved["before"] >= saved["nbytes"] - SLACK
    assert saved["peak"] - saved["before"] <= bound, (saved, table)
    # loading into a fresh store: its own RAM (directory, disk bookkeeping) plus the working set
    assert loaded["peak"] <= loaded["nbytes"] + bound, (loaded, table)
