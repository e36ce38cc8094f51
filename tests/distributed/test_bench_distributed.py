"""benchmarks.distributed: its byte counter agrees with tierec's own, on a tiny traffic run."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.distributed import main


def test_tiny_run_counts_bytes_and_reports(tmp_path: Path, capsys) -> None:
    out = tmp_path / "d.json"
    args = ["--batch", "64", "--steps", "2", "--warmup", "2", "--hot-rows", "64", "--hot-refresh", "1",
            "--traffic-world", "2", "--worlds", "2", "--sections", "traffic", "--repeats", "0", "--out", str(out)]
    assert main(args) == 0
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"naive", "dedup", "dedup+hot"}
    # tierec's own counters and the torch.distributed wrapper agree (up to the loss all-reduce)
    for r in rows.values():
        assert abs(r["bytes_wire"] - r["bytes_tierec"]) <= 64, r
    assert rows["naive"]["bytes_wire"] > rows["dedup"]["bytes_wire"] > 0
    assert rows["dedup+hot"]["hot_rows"] > 0
    text = capsys.readouterr().out
    assert "naive / this" in text
