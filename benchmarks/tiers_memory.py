"""Resident memory of a tiered table larger than its memory budget (run in a fresh process).

Grows one table to ``--table-x`` times its memory budget with the disk tier
behind it, training-style lookups (new ids plus Zipf re-accesses of old ones),
and reports the peak resident set growth beside the budget and the stated
overhead: the store's bookkeeping (the directory of ids, about 21 bytes per id,
and a few bytes per fast-tier and disk slot), half the directory again while
it grows, per-batch scratch and a fixed 32 MiB.

    python -m benchmarks.tiers_memory --budget 64MiB --table-x 4 --dim 32 --disk /var/tmp

>>> from benchmarks.tiers_memory import overhead_allowance
>>> overhead_allowance(batch_rows=1000, record_bytes=132, directory_bytes=0) > 32 << 20
True
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False when not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


FIXED_OVERHEAD = 32 << 20  # bytes: I/O thread stacks and arenas, compiled code, allocator slack


def overhead_allowance(batch_rows: int, record_bytes: int, directory_bytes: int = 0) -> int:
    """The stated overhead on top of the budget and the store's bookkeeping (docs/performance.md):
    a fixed part, per-batch scratch, and half the directory while it grows (old and new arrays)."""
    return FIXED_OVERHEAD + 8 * batch_rows * (record_bytes + 64) + directory_bytes // 2


def run(budget: int, table_x: float, dim: int, batch_rows: int, disk: str, zipf: float = 1.2, seed: int = 0) -> dict:
    import numpy as np

    from tierec.embedding import TableConfig
    from tierec.store import TieredGroup, TierSpec

    record = 4 * (dim + 1)  # row-wise Adagrad: one float of state per row
    total_rows = int(table_x * budget / record)
    spec = TierSpec(cache_bytes=budget // 4, host_bytes=budget - budget // 4, disk_dir=disk)
    # Warm-up in a throwaway group: compile kernels and touch code pages before measuring (the last lookup reads
    # rows back from disk: the disk reads' kernels compile here, not while measuring)
    warm = TieredGroup([TableConfig(name="w", dim=dim, features=["w"])], TierSpec(cache_bytes=64 * record, disk_dir=disk, host_bytes=0))
    for lo in (0, 40, 80, 0):
        warm.lookup(np.arange(lo, lo + 40, dtype=np.int64), np.zeros(40, dtype=np.int32), insert=True)
    warm.close()
    del warm
    base = rss_bytes()
    can_reset = reset_peak_rss()
    g = TieredGroup([TableConfig(name="t", dim=dim, features=["f"])], spec, seed=seed)
    rng = np.random.default_rng(seed)
    tabs = np.zeros(batch_rows, dtype=np.int32)
    inserted, peak, t0 = 0, base, time.perf_counter()
    while inserted < total_rows:
        n_new = min(batch_rows // 2, total_rows - inserted)
        new = np.arange(inserted, inserted + n_new, dtype=np.int64)
        old = np.unique(rng.zipf(zipf, size=batch_rows - n_new) % max(inserted, 1)).astype(np.int64)
        keys = np.unique(np.concatenate([new, old]))
        g.lookup(keys, tabs[: keys.size], insert=True)
        inserted += n_new
        peak = max(peak, rss_bytes())
    seconds = time.perf_counter() - t0
    st = g.stats()["t"]
    final = rss_bytes()
    row_bytes = (g.weights.numel() + sum(t.numel() for t in g.state.values())) * 4 + g.host.nbytes()
    peak = max(peak, final, peak_rss_bytes() if can_reset else 0)
    out = {
        "budget_bytes": budget,
        "table_bytes": total_rows * record,
        "rows": total_rows,
        "record_bytes": record,
        "directory_bytes": g.index.resident_nbytes(),  # pages in RAM (per-fast-tier-slot arrays included)
        "directory_bytes_per_id": (g.index.resident_nbytes() - g.index.cache_nbytes() + g.disk.nbytes()) / total_rows,
        # directory, disk bitmap, fast-tier slot metadata, free lists: all but the rows themselves
        "bookkeeping_bytes": g.nbytes() - row_bytes,
        "allowance_bytes": overhead_allowance(batch_rows, record, g.index.nbytes()),
        "baseline_rss_bytes": base,
        "peak_rss_growth_bytes": peak - base,
        "final_rss_growth_bytes": final - base,
        "rows_cache": st["rows_cache"],
        "rows_host": st["rows_host"],
        "rows_disk": st["rows_disk"],
        "disk_file_bytes": g.disk_bytes(),
        "seconds": seconds,
    }
    out["bound_bytes"] = budget + out["bookkeeping_bytes"] + out["allowance_bytes"]
    out["within_budget"] = out["peak_rss_growth_bytes"] <= out["bound_bytes"]
    g.close()
    return out


def main(argv: list[str] | None = None) -> int:
    from tierec.store.sizes import format_size, parse_size

    p = argparse.ArgumentParser(prog="benchmarks.tiers_memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", default="64MiB")
    p.add_argument("--table-x", type=float, default=4.0, help="table size / memory budget")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch-rows", type=int, default=20_000, help="unique rows per lookup")
    p.add_argument("--disk", default="", help="directory of the disk tier (default: the temp dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object only")
    a = p.parse_args(argv)
    res = run(parse_size(a.budget), a.table_x, a.dim, a.batch_rows, a.disk or tempfile.gettempdir())
    if a.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:28s} {format_size(v) if k.endswith('bytes') else v}")
    return 0 if res["within_budget"] else 1


if __name__ == "__main__":
    sys.exit(main())
