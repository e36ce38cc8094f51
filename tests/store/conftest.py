"""Store tests run single-threaded: the machine is shared, and parallel kernels on tiny
batches cost more in thread wake-ups than they save."""

from __future__ import annotations

import numba
import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    nb_threads, torch_threads = numba.get_num_threads(), torch.get_num_threads()
    numba.set_num_threads(1)
    torch.set_num_threads(1)
    yield
    numba.set_num_threads(nb_threads)
    torch.set_num_threads(torch_threads)
