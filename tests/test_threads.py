"""use_threads: the thread count set is the one torch keeps once numba's pool has started."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# numba's pool starts at the first parallel kernel (here, or at use_threads), in a fresh process
SCRIPT = """
import sys, numba, numpy as np, torch
from tierec.threads import use_threads

@numba.njit(parallel=True)
def fill(a):
    for i in numba.prange(a.shape[0]):
        a[i] = 1.0

if sys.argv[1] == "use_threads":
    use_threads(1)
else:
    torch.set_num_threads(1)
torch.get_num_threads()  # torch's OpenMP is set up (as once it has run) before numba's first kernel
fill(np.zeros(64))
print(torch.get_num_threads())
"""


@pytest.mark.parametrize("how", ["use_threads", "torch"])
def test_one_thread_stays_one_after_numba_starts(how: str) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True, text=True,
                         env=dict(os.environ, NUMBA_NUM_THREADS="2"), check=True)
    # torch's own setting is undone by the pool's start; use_threads starts the pool first
    assert int(out.stdout.strip()) == (1 if how == "use_threads" else 2)


def test_zero_threads_is_refused() -> None:
    from tierec.threads import use_threads

    with pytest.raises(ValueError, match="at least 1"):
        use_threads(0)
