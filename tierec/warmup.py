"""Compile tierec's numba kernels once per install, and say so while it happens.

The kernels are compiled for the CPU at their first use and cached beside
their modules (numba's ``cache=True``), so only the first run after an
install pays for it (about a minute on 2 cores). ``make venv`` runs
``python -m tierec.warmup`` right after installing, so no training run pays
it; elsewhere the first ``tierec train`` prints :data:`NOTE` once.

>>> from tierec.warmup import kernels_cached
>>> isinstance(kernels_cached(), bool)
True
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

NOTE = "compiling tierec's kernels for this CPU (once per install, about a minute on 2 cores)"


def kernels_cached() -> bool:
    """Whether the embedding engine's kernels are in numba's cache (their index files exist)."""
    from tierec.embedding import kernels

    cache = Path(kernels.__file__).parent / "__pycache__"
    return any(cache.glob("kernels.*.nbi"))


def note_compilation(echo: Callable[[str], None]) -> None:
    """One line before a run that will compile the kernels."""
    if not kernels_cached():
        echo(NOTE)


def main() -> int:
    """A tiny training run (plain, tiered and pruned tables, evaluation, a checkpoint) to compile the kernels."""
    from tierec.config import load_config
    from tierec.train.trainer import Trainer

    t0 = time.perf_counter()
    print(NOTE, file=sys.stderr, flush=True)
    base = ["data.synthetic.train_rows=4096", "data.synthetic.test_rows=1024", "train.batch_size=1024",
            "train.progress=false", "train.plots=false", "embedding.dim=8"]
    with tempfile.TemporaryDirectory(prefix="tierec-warmup-") as tmp:
        for name, extra in {"plain": [], "tiered": ["store.enabled=true", "store.cache_size=1MiB", f"store.disk_path={tmp}/disk"],
                            "pruned": ["prune.enabled=true", "prune.every=2"]}.items():
            Trainer(load_config(None, base + extra), Path(tmp) / name, echo=lambda _: None).fit()
    _large_fast_tier()
    print(f"tierec's kernels are compiled ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


def _large_fast_tier() -> None:
    """The eviction kernels only a fast tier of 65,536 slots or more runs (the tiny runs never fill one)."""
    import numpy as np

    from tierec.embedding.layout import RecordLayout
    from tierec.embedding.table import TableConfig
    from tierec.store.directory import Directory
    from tierec.store.eviction import Eviction
    from tierec.store.fast_tier import FastTier
    from tierec.store.horizon import Horizon
    from tierec.store.spec import CachePolicy

    n = 1 << 16
    fast = FastTier(n, RecordLayout.of_tables([TableConfig(name="t", dim=1, features=["f"])]), "cpu")
    fast.slot_lid[fast.take(n)] = 0
    horizon = Horizon(2)
    horizon.foresee(np.array([0]), np.zeros(1, dtype=np.int32), np.array([0]), at=2, step=1)
    for policy in CachePolicy:  # LFU's scores are float32 counts, LRU's int32 steps; with a horizon, float64
        for h in (Horizon(0), horizon):
            Eviction(policy, h).choose(fast, Directory(cache_slots=n + 1), clock=1, wanted=64, step=1)
    horizon.ranked(np.zeros(1, dtype=np.float32), np.zeros(1, dtype=np.int64), step=1)  # the rows leaving: by lid
    horizon.advance(2)


if __name__ == "__main__":
    raise SystemExit(main())
