"""How the disk rows a tiered run reads lie in the table file, against a file ordered by hotness.

    python -m benchmarks.disk_layout --budget-x 16 --cold-precision int8 --disk-dir /work/tiers_bench

Runs ``benchmarks.tiers``'s disk workload (its options, one tiered mode) a window of ``--window`` batches at a
time. Before each window it probes which of the window's rows are on disk and not in the fast tier (the rows its
read-ahead reads) and counts the 4 KiB pages those rows touch where they lie, and where they would lie in a file of the same rows ordered by the workload's true
popularity (its Zipf rank; ties by table): the most any hotness packing could save on this workload; and the bytes
the disk tier's reads of them would cover (records less than 16 KiB apart read in one request). Also the
share of the rows read from their load-time slot (never rewritten since the table was loaded).

>>> from benchmarks.disk_layout import main
>>> main(["--tables", "2", "--rows", "2000", "--train-batch", "64", "--steps", "8", "--warmup", "2",
...       "--budget-x", "4", "--quiet"])
0
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import tiers
from benchmarks.workload import Workload, popularity_rank
from tierec.store.directory import LOC_DISK
from tierec.store.disk_reads import direct_read_bytes
from tierec.store.group import TierStore

PAGE = 4096


def parser() -> argparse.ArgumentParser:
    p = tiers.parser()
    p.prog = "benchmarks.disk_layout"
    p.set_defaults(modes="disk+prefetch4+ahead")
    p.add_argument("--window", type=int, default=4, help="lookups per window whose pages are counted together")
    return p


def _pages(slots: np.ndarray, rec_bytes: int) -> int:
    off = np.unique(slots) * rec_bytes
    return int(np.unique(np.concatenate([off // PAGE, (off + rec_bytes - 1) // PAGE])).size)


def _window_disk_rows(runner: tiers.Runner, group: TierStore, window: list) -> tuple[np.ndarray, np.ndarray]:
    """(lids, disk slots) of the rows a window of batches needs that are on disk and not in the fast tier now."""
    ids = [runner.parts.embeddings.group_ids(0, b.sparse) for b in window]
    keys, tabs = np.concatenate([k for k, _ in ids]), np.concatenate([t for _, t in ids])
    lids, cs, loc, home = group.index.probe(keys, tabs)
    away = (lids >= 0) & (cs < 0) & (loc == LOC_DISK)
    lids, first = np.unique(lids[away], return_index=True)
    return lids, home[away][first].astype(np.int64)


def _hotness_positions(group: TierStore, w: Workload) -> np.ndarray:
    """[rows] position of each lid in a file ordered by the workload's true popularity (ties by table)."""
    d = group.index
    keys = d.keys[: d.num_rows].astype(np.int64)
    tab, idx = keys >> 32, keys & 0xFFFFFFFF
    rank = np.empty(keys.size, dtype=np.int64)
    for t in range(w.tables):
        m = tab == t
        rank[m] = popularity_rank(w, t, idx[m])
    pos = np.empty(keys.size, dtype=np.int64)
    pos[np.lexsort((tab, rank))] = np.arange(keys.size)
    return pos


def run(a: argparse.Namespace) -> dict:
    """The workload's windows in turn: before each, the disk rows it needs are counted (probed as its read-ahead
    would find them), then its batches train."""
    w, batches = tiers.training_batches(a, a.warmup + a.steps)
    runner = tiers.Runner(a, a.modes, w, a.disk_dir or tempfile.gettempdir())
    try:
        group = runner.monitor.groups[0]
        d = group.index
        loaded = np.full(d.num_rows, -1, dtype=np.int64)
        on = np.flatnonzero(d.loc[: d.num_rows] == LOC_DISK)
        loaded[on] = d.home[on]
        runner.run(batches[: a.warmup], timed=False)
        hot = _hotness_positions(group, w)
        rec_bytes = group.disk.rec_bytes
        rows = at_load = actual = by_hotness = span = span_hot = 0
        for i in range(a.warmup, len(batches), a.window):
            part = batches[i : i + a.window]
            lids, slots = _window_disk_rows(runner, group, part)
            rows += lids.size
            at_load += int(np.count_nonzero(loaded[lids] == slots))
            if lids.size:
                actual += _pages(slots, rec_bytes)
                by_hotness += _pages(hot[lids], rec_bytes)
                span += direct_read_bytes(slots, rec_bytes)
                span_hot += direct_read_bytes(hot[lids], rec_bytes)
            runner.run(part, timed=True)
        steps = max(a.steps, 1)
        return {
            "mode": a.modes, "budget_x": a.budget_x, "cold_precision": a.cold_precision, "window": a.window,
            "record_bytes": rec_bytes, "disk_rows_per_step": rows / steps,
            "share_at_load_slot": at_load / max(rows, 1),
            "pages_per_step": actual / steps, "pages_per_step_by_hotness": by_hotness / steps,
            "read_mib_per_step": span / steps / 2**20, "read_mib_per_step_by_hotness": span_hot / steps / 2**20,
            "samples_per_s": runner.result(a.train_batch)["samples_per_s"],
        }
    finally:
        runner.close()


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    res = {"argv": argv if argv is not None else sys.argv[1:], "layout": run(a)}
    if not a.quiet:
        r = res["layout"]
        print(
            f"{r['budget_x']:g}x {r['cold_precision']}: {r['disk_rows_per_step']:,.0f} rows from disk per step "
            f"({r['share_at_load_slot']:.0%} from their load-time slot); 4 KiB pages per step, windows of "
            f"{r['window']}: {r['pages_per_step']:,.0f} as laid out, {r['pages_per_step_by_hotness']:,.0f} ordered by hotness; "
            f"MiB read per step (16 KiB gaps merged): {r['read_mib_per_step']:,.1f} as laid out, "
            f"{r['read_mib_per_step_by_hotness']:,.1f} ordered by hotness"
        )
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
