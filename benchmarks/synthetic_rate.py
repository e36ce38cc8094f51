"""How fast the synthetic generator makes rows (target: >= 1M rows/s on 2 cores).

    python -m benchmarks.synthetic_rate --rows 2000000 --batch 4096 --repeats 3

Prints rows/s (median and best wall clock, and rows per CPU-second, which a busy
shared machine distorts least) of three paths: the generator alone (``SyntheticData``),
``open_source`` (torch Batches) and ``open_source`` behind a ``BackgroundLoader``.
The shared machine is noisy, so this is a script and not a timed unit test.

>>> from benchmarks.synthetic_rate import main
>>> main(["--rows", "8192", "--repeats", "1", "--quiet"])
0
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterable

from tierec.config import DataConfig, SyntheticConfig
from tierec.data import BackgroundLoader, SyntheticData, open_source
from tierec.data.synth_kernels import THREADS


def _rate(rows: int, run: Callable[[], Iterable[object]], repeats: int) -> tuple[float, float, float]:
    """Median and best rows/s (wall clock), and rows per CPU-second of this process (all its threads)."""
    rates, cpu_rates = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in run():
            pass
        rates.append(rows / (time.perf_counter() - t0))
        cpu_rates.append(rows / max(time.process_time() - c0, 1e-9))
    return statistics.median(rates), max(rates), statistics.median(cpu_rates)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.synthetic_rate", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ids-per-feature", type=int, default=1)
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    cfg = DataConfig(synthetic=SyntheticConfig(train_rows=a.rows, ids_per_feature=a.ids_per_feature))
    data = SyntheticData(cfg.synthetic)
    data.block("train", 0, a.batch)  # compile (or load the numba cache) outside the timing
    results = {
        "generator": _rate(a.rows, lambda: data.blocks("train", 0, a.batch), a.repeats),
        "open_source": _rate(a.rows, lambda: open_source(cfg, "train", a.batch), a.repeats),
        "open_source + BackgroundLoader": _rate(
            a.rows, lambda: BackgroundLoader(open_source(cfg, "train", a.batch), depth=4), a.repeats
        ),
    }
    if not a.quiet:
        print(f"synthetic rows/s, {a.rows:,} rows, batch {a.batch}, {THREADS} generator threads, "
              f"ids_per_feature {a.ids_per_feature}, {a.repeats} repeats")  # fmt: skip
        print(f"  {'':32s} {'median':>12s} {'best':>12s} {'per CPU-s':>12s}")
        for name, (median, best, per_cpu) in results.items():
            print(f"  {name:32s} {median:>12,.0f} {best:>12,.0f} {per_cpu:>12,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
