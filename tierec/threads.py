"""How many threads this process's torch and numba kernels use: set here, once, in one order.

numba's OpenMP pool and torch share the OpenMP runtime, and the pool's first start sets the
starting thread's OpenMP thread count to the pool's size, behind torch's back: a
``torch.set_num_threads(1)`` made before it is silently undone on that thread, and only there.
Where numba first ran then decided how many threads the dense step used (a lookup on another
thread left it alone), and with it the rounding of the dense gradients: a tiered run and the
same run in memory drifted apart after tens of steps. :func:`use_threads` starts the pool
first, then sets both counts.

>>> from tierec.threads import use_threads
>>> import torch
>>> before = torch.get_num_threads()
>>> use_threads(1); torch.get_num_threads()
1
>>> use_threads(before)
"""

from __future__ import annotations

import numba
import torch


def use_threads(n: int) -> None:
    """torch's intra-op threads and this thread's numba threads = ``n`` (numba's at most its pool's size)."""
    if n < 1:
        raise ValueError(f"threads must be at least 1, got {n}")
    numba.get_num_threads()  # starts numba's pool now (a no-op once started), before torch's count is set
    torch.set_num_threads(n)
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
