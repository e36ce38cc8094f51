"""Resident memory of a table 4x larger than its budget, measured in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_resident_memory_stays_within_the_budget(tmp_path) -> None:
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    args = ["--budget", "8MiB", "--table-x", "4", "--dim", "32", "--batch-rows", "4000", "--disk", str(tmp_path), "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.tiers_memory", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode in (0, 1), proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["table_bytes"] >= 4 * res["budget_bytes"] * 0.99
    assert res["rows_disk"] >= 0.7 * res["rows"]  # most of the table really lives on disk
    assert res["rows_cache"] + res["rows_host"] <= res["budget_bytes"] // res["record_bytes"]
    # The stated bound: budget + bookkeeping (directory, slot metadata) + the allowance.
    bound = res["budget_bytes"] + res["bookkeeping_bytes"] + res["allowance_bytes"]
    assert res["peak_rss_growth_bytes"] <= bound, res
    assert res["bookkeeping_bytes"] <= res["directory_bytes"] + 24 * res["rows"] // 4  # a few bytes per slot besides
    assert res["within_budget"]
