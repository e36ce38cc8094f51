"""Starting processes: local spawning for tests, dying with the parent.

``spawn`` starts N local processes without torchrun (tests and benchmarks):
each gets the environment torchrun would give it, joins the job with
``init_distributed`` and calls ``fn(ctx, *args)``. ``parent_death_hook`` and
``die_with_parent`` tie a process's life to its parent's (``PR_SET_PDEATHSIG``):
``tierec train --nproc N`` (tierec/distributed/local_job.py) gives its ranks
the first, a rank under a torchrun started by hand calls the second.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

from tierec.config import DistConfig

# What every job imports, loaded once into the fork server. torch._dynamo is imported
# lazily by the first torch.optim optimizer and costs seconds.
_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.nn.parallel", "tierec.train.trainer"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    rank: int, world: int, port: int, cfg: DistConfig, fn: Callable, args: tuple, env: dict[str, str], log_dir: str | None
) -> None:
    from tierec.distributed.context import init_distributed

    if log_dir is not None:  # like torchrun --redirects 3: this rank's stdout and stderr to a file
        log = open(Path(log_dir) / f"rank{rank}.log", "w", buffering=1)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    os.environ.update(env)
    os.environ.update({
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    })
    ctx = init_distributed(cfg, threads=1)
    fn(ctx, *args)
    ctx.close()  # only after a clean finish: tearing down a broken group can block


def spawn(
    fn: Callable[..., Any],
    nprocs: int,
    args: tuple = (),
    *,
    cfg: DistConfig | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 120.0,
    check: bool = True,
    log_dir: str | Path | None = None,
) -> list[int]:
    """Run ``fn(ctx, *args)`` on ``nprocs`` fresh local processes (gloo); returns their exit codes.

    With ``check`` a non-zero exit raises; with ``log_dir`` rank r's output goes to
    ``log_dir/rank{r}.log``. Unlike torch.multiprocessing's join, a
    failed process does not get the others killed: they must notice by
    themselves (what the fault tests check). ``fn`` must be importable by name.
    Processes come from a fork server that has imported torch and tierec once
    (later jobs start in milliseconds), never from a fork of the caller, whose
    numba worker threads would not survive it.
    """
    cfg = cfg or DistConfig(timeout_s=60)
    port = free_port()
    mpc = multiprocessing.get_context("forkserver")
    mpc.set_forkserver_preload(_PRELOAD)
    logs = None if log_dir is None else str(log_dir)
    procs = [mpc.Process(target=_entry, args=(r, nprocs, port, cfg, fn, args, env or {}, logs)) for r in range(nprocs)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(timeout=max(deadline - time.monotonic(), 0.01))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
        procs[r].join()
    if hung:
        raise TimeoutError(f"ranks {hung} of a spawned job did not finish within {timeout_s:.0f}s")
    codes = [p.exitcode for p in procs]
    if check and any(codes):
        raise RuntimeError(f"spawned job failed: exit codes by rank {codes}")
    return codes


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux), else None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def parent_death_hook(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` for a child of this process: ``sig`` reaches the child when this process dies.

    The parent is this process's calling thread (keep it alive: call from the main thread). Everything is
    resolved here, before the fork, so the child only makes two system calls; a child whose parent died
    between the fork and the call kills itself with ``sig``. None where there is no ``prctl``.
    """
    prctl, parent = _prctl(), os.getpid()
    if prctl is None:
        return None

    def hook() -> None:
        prctl(1, int(sig), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG; kept across exec
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return hook


def die_with_parent(sig: int) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (PR_SET_PDEATHSIG); a no-op elsewhere."""
    prctl = _prctl()
    if prctl is None:
        return
    parent = os.getppid()
    prctl(1, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the call
        os.kill(os.getpid(), sig)
