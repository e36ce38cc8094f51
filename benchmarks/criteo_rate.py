"""How fast the readers parse raw Criteo text, and how fast shards stream back.

    python -m benchmarks.criteo_rate --copies 100

The Criteo sample (``../shared/data/criteo/train_head10000.txt``, not part of the
repository) is concatenated ``--copies`` times into a temporary file, which is
then read through ``open_source`` (Criteo TSV), written as shards and read back.
Prints rows/s (median and best of ``--repeats``, and rows per CPU-second, which
a busy shared machine distorts least); the temporary files are removed.

>>> from benchmarks.criteo_rate import main
>>> main(["--copies", "1", "--repeats", "1", "--quiet"])
0
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tierec.config import DataConfig
from tierec.data import open_source, preprocess

SAMPLE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "criteo" / "train_head10000.txt"


def _rate(cfg: DataConfig, batch: int, repeats: int) -> tuple[tuple[float, float, float], int]:
    """(median rows/s, best rows/s, rows per CPU-second of all threads) and the rows read."""
    rates, cpu_rates, rows = [], [], 0
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        rows = sum(b.size for b in open_source(cfg, "train", batch))
        rates.append(rows / (time.perf_counter() - t0))
        cpu_rates.append(rows / max(time.process_time() - c0, 1e-9))
    return (statistics.median(rates), max(rates), statistics.median(cpu_rates)), rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.criteo_rate", description=__doc__.split("\n")[0])
    p.add_argument("--sample", type=Path, default=SAMPLE)
    p.add_argument("--copies", type=int, default=100)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    if not a.sample.exists():
        print(f"{a.sample} not found; nothing to measure")
        return 0
    text = a.sample.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "criteo.txt"
        with path.open("wb") as fh:
            for _ in range(a.copies):
                fh.write(text)
        cfg = DataConfig(source=str(path), test_fraction=0)
        parse, rows = _rate(cfg, a.batch, a.repeats)
        t0 = time.perf_counter()
        preprocess(cfg, Path(tmp) / "shards", progress=False)
        write = rows / (time.perf_counter() - t0)
        shards, _ = _rate(DataConfig(source=str(Path(tmp) / "shards")), a.batch, a.repeats)
    if not a.quiet:
        print(f"Criteo rows/s, {rows:,} rows ({a.copies} copies of the sample), batch {a.batch}, {a.repeats} repeats")
        print(f"  {'':32s} {'median':>12s} {'best':>12s} {'per CPU-s':>12s}")
        print(f"  {'parse raw TSV (open_source)':32s} {parse[0]:>12,.0f} {parse[1]:>12,.0f} {parse[2]:>12,.0f}")
        print(f"  {'preprocess to shards':32s} {write:>12,.0f}")
        print(f"  {'read shards (open_source)':32s} {shards[0]:>12,.0f} {shards[1]:>12,.0f} {shards[2]:>12,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
