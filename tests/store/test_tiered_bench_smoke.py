"""benchmarks.tiers on tiny sizes, so the commands of docs/performance.md cannot rot."""

from __future__ import annotations

import json
import os

from benchmarks.tiers import main


def test_disk_benchmark_runs(tmp_path) -> None:
    out = tmp_path / "tiers.json"
    args = ["--which", "disk", "--tables", "3", "--rows", "3000", "--train-batch", "64", "--steps", "4", "--warmup", "2"]
    args += ["--rounds", "2", "--disk-dir", str(tmp_path), "--threads", "1", "--quiet", "--out", str(out)]
    assert main(args) == 0
    whole = json.loads(out.read_text())
    assert {"cpu", "omp_wait_policy", "cpu_flags_bf16"} <= set(whole["machine"])  # what a figure needs beside it
    res = whole["disk"]
    modes = {r["mode"]: r for r in res["runs"]}
    assert set(modes) == {"memory", "disk", "disk+prefetch4+ahead", "disk+prefetch4+ahead+horizon128"}
    assert modes["disk"]["disk_read_rows_per_step"] > 0  # the table really is read from disk
    assert modes["disk"]["table_bytes"] >= 3.9 * modes["disk"]["budget_bytes"]
    assert "disk+prefetch4+ahead/memory throughput (paired)" in res["ratios"]
    assert "disk+prefetch4+ahead+horizon128/memory throughput (paired)" in res["ratios"]
    by_thread = modes["disk+prefetch4+ahead"]["cpu_ms_per_step_by_thread"]  # the lookup ahead ran on its own thread
    assert "MainThread" in by_thread and "tierec-ahead" in by_thread
    for r in modes.values():  # the CPU's share of the cores the process may use while the steps ran: at most all
        assert r["cores"] == len(os.sched_getaffinity(0)) and 0.0 < r["cpu_busy_share"] <= 1.05, r


def test_disk_benchmark_runs_with_compact_cold_rows(tmp_path) -> None:
    out = tmp_path / "tiers.json"
    args = ["--which", "disk", "--tables", "3", "--rows", "3000", "--train-batch", "64", "--steps", "4", "--warmup", "2", "--rounds", "2"]
    args += ["--modes", "memory,disk", "--cold-precision", "int8", "--disk-dir", str(tmp_path), "--threads", "1", "--quiet", "--out", str(out)]
    assert main(args) == 0
    modes = {r["mode"]: r for r in json.loads(out.read_text())["disk"]["runs"]}
    assert modes["disk"]["disk_read_rows_per_step"] > 0
