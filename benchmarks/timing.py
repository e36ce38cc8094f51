"""Alternating timings: every repeat runs each system once, in a rotated order.

Other processes share the machine, so a slow spell hits all systems of one
repeat rather than one system's whole measurement; medians over repeats then
discard the worst spells.

>>> from benchmarks.timing import alternate
>>> class S:
...     name = "s"
>>> t = alternate([S()], repeats=3, work=lambda s, r: None)
>>> len(t.wall["s"]), len(t.cpu["s"]), len(t.load)
(3, 3, 3)
"""

from __future__ import annotations

import gc
import statistics
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class Timings:
    wall: dict[str, list[float]] = field(default_factory=dict)  # seconds per repeat
    cpu: dict[str, list[float]] = field(default_factory=dict)  # process CPU seconds (all threads) per repeat
    load: list[float] = field(default_factory=list)  # 1-minute load average at each repeat's start


def alternate(systems: Sequence, repeats: int, work: Callable[[object, int], None]) -> Timings:
    """Wall and CPU seconds of ``work(system, repeat)`` for each system and repeat.

    CPU time counts only this process's threads, so it is less sensitive to
    other processes than wall time (but it includes threads spinning at barriers).
    """
    t = Timings({s.name: [] for s in systems}, {s.name: [] for s in systems})
    n = len(systems)
    for r in range(repeats):
        t.load.append(os.getloadavg()[0])
        for k in range(n):
            s = systems[(r + k) % n]
            prepare = getattr(s, "before_repeat", None)
            if prepare is not None:
                prepare()
            gc.collect()
            c0, t0 = time.process_time(), time.perf_counter()
            work(s, r)
            t.wall[s.name].append(time.perf_counter() - t0)
            t.cpu[s.name].append(time.process_time() - c0)
    return t


def paired_ratio(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Median over repeats of xs[r] / ys[r]: both measured back to back in the same repeat."""
    return median([x / y for x, y in zip(xs, ys)])


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: Sequence[float]) -> float:
    """(max - min) / median: how noisy the repeats were."""
    if len(xs) < 2:
        return 0.0
    m = statistics.median(xs)
    return (max(xs) - min(xs)) / m if m else float("nan")
