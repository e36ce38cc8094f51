"""Starting a job: ``tierec train --nproc N`` re-launches itself under torchrun; tests spawn locally.

``torchrun_command`` builds the ``python -m torch.distributed.run --standalone
--nproc_per_node N -m tierec ...`` line that ``--nproc`` runs. ``spawn`` starts
N local processes without torchrun (tests and benchmarks): each gets the
environment torchrun would give it, joins the job with ``init_distributed``
and calls ``fn(ctx, *args)``.

>>> from tierec.distributed.launch import torchrun_command
>>> torchrun_command(2, ["train", "--nproc", "2", "--run-dir", "r"])[3:]
['--standalone', '--nproc_per_node', '2', '-m', 'tierec', 'train', '--run-dir', 'r']
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import time
from typing import Any, Callable

import torch.multiprocessing as mp

from tierec.config import DistConfig

_PRELOAD = ["torch", "torch.distributed", "tierec.distributed.sharded", "tierec.train.trainer"]


def strip_nproc(argv: list[str]) -> list[str]:
    """``argv`` without ``--nproc N`` / ``--nproc=N``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = True
            continue
        if a.startswith("--nproc="):
            continue
        out.append(a)
    return out


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """The command line that runs ``tierec <argv>`` (minus ``--nproc``) on ``nproc`` local processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", "tierec", *strip_nproc(argv)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, cfg: DistConfig, fn: Callable, args: tuple, env: dict[str, str]) -> None:
    from tierec.distributed.context import init_distributed

    os.environ.update(env)
    os.environ.update({
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    })
    ctx = init_distributed(cfg, threads=1)
    try:
        fn(ctx, *args)
    finally:
        ctx.close()


def spawn(
    fn: Callable[..., Any],
    nprocs: int,
    args: tuple = (),
    *,
    cfg: DistConfig | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 120.0,
) -> None:
    """Run ``fn(ctx, *args)`` on ``nprocs`` fresh local processes (gloo); raises if any fails.

    ``fn`` must be importable by name (a module-level function). Processes come
    from a fork server that has imported torch and tierec once (later jobs
    start in milliseconds); never from a fork of the caller, whose numba worker
    threads would not survive it.
    """
    cfg = cfg or DistConfig(timeout_s=60)
    port = free_port()
    multiprocessing.get_context("forkserver").set_forkserver_preload(_PRELOAD)
    pc = mp.start_processes(_entry, args=(nprocs, port, cfg, fn, args, env or {}), nprocs=nprocs, join=False,
                            start_method="forkserver")
    deadline = time.monotonic() + timeout_s
    while not pc.join(timeout=0.2):
        if time.monotonic() > deadline:
            for p in pc.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"spawned job did not finish within {timeout_s:.0f}s")
