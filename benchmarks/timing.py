"""Alternating timings: every repeat runs each system once, in a rotated order.

Other processes share the machine, so a slow spell hits all systems of one
repeat rather than one system's whole measurement; medians over repeats then
discard the worst spells.

>>> from benchmarks.timing import alternate
>>> class S:
...     name = "s"
>>> t = alternate([S()], repeats=3, work=lambda s, r: None)
>>> len(t["s"])
3
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence


def alternate(systems: Sequence, repeats: int, work: Callable[[object, int], None]) -> dict[str, list[float]]:
    """Seconds of ``work(system, repeat)`` for each system and repeat."""
    times: dict[str, list[float]] = {s.name: [] for s in systems}
    n = len(systems)
    for r in range(repeats):
        for k in range(n):
            s = systems[(r + k) % n]
            prepare = getattr(s, "before_repeat", None)
            if prepare is not None:
                prepare()
            gc.collect()
            t0 = time.perf_counter()
            work(s, r)
            times[s.name].append(time.perf_counter() - t0)
    return times


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: Sequence[float]) -> float:
    """(max - min) / median: how noisy the repeats were."""
    if len(xs) < 2:
        return 0.0
    m = statistics.median(xs)
    return (max(xs) - min(xs)) / m if m else float("nan")
