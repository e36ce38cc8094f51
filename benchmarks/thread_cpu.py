"""CPU time per thread of this process, by thread name (Linux: /proc/self/task; elsewhere nothing).

Python threads are named by their ``threading`` name, a pool's numbered threads pooled under one name
("tierec-disk-ahead_3" -> "tierec-disk-ahead"); threads Python did not start (OpenMP's and numba's
workers) count together as "native". On a few cores this shows who takes the CPU a step needs:
e.g. OpenMP's spinning worker beside a tiered step (docs/performance.md, "The tiers' CPU").

>>> before = thread_cpu(); _ = sum(i * i for i in range(10**5))
>>> spent = cpu_between(before, thread_cpu()); all(v >= 0 for v in spent.values())
True
"""

from __future__ import annotations

import os
import re
import threading
from collections import Counter

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_cpu() -> dict[int, tuple[str, float]]:
    """{native thread id: (name, CPU seconds so far)} of this process's threads; {} where /proc is missing."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        name = re.sub(r"_\d+$", "", names.get(int(tid), "native"))
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / _TICK)  # utime + stime
    return out


def cpu_between(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per thread name between two :func:`thread_cpu` snapshots (threads started meanwhile from 0)."""
    spent: Counter = Counter()
    for tid, (name, t) in after.items():
        spent[name] += t - (before[tid][1] if tid in before else 0.0)
    return dict(spent)
