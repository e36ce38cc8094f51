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
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist

from tierec.config import Config, DistConfig
from tierec.distributed.context import DistContext

# What every job imports, loaded once into the fork server. torch._dynamo is imported
# lazily by the first torch.optim optimizer and costs seconds.
_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.nn.parallel", "tierec.distributed.trainer"]


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


def _with_run_dir(argv: list[str], run_dir: Path) -> list[str]:
    if any(a == "--run-dir" or a.startswith("--run-dir=") for a in argv):
        return argv
    return [*argv, "--run-dir", str(run_dir)]


def run_train(
    cfg: Config, run_dir: Path, *, resume: bool, nproc: int, argv: list[str], report: Callable[[dict], None]
) -> int:
    """``tierec train`` on several processes; returns the exit status.

    Outside torchrun (``--nproc N``) it re-launches the same command under torchrun
    (one machine) with the run directory fixed, and waits. Inside torchrun it joins
    the job, trains, and rank 0 reports. A lost rank ends every other rank with
    one line naming it and exit status 3.
    """
    from tierec.distributed.context import init_distributed, launched_by_torchrun

    if not launched_by_torchrun():
        if nproc <= 1:
            raise ValueError("run_train needs --nproc > 1 or a torchrun environment")
        return subprocess.call(torchrun_command(nproc, _with_run_dir(argv, run_dir)))

    ctx = init_distributed(cfg.dist, cfg.train.device, threads=cfg.train.threads)
    shared = [str(run_dir)]
    dist.broadcast_object_list(shared, src=0, group=ctx.dense_group)  # a default run dir names rank 0's clock
    summary = train_in_job(ctx, cfg, Path(shared[0]), resume=resume)
    ctx.close()
    if ctx.is_main:
        report(summary)
    return 0


LOST_RANK_STATUS = 3


def train_in_job(ctx: DistContext, cfg: Config, run_dir: Path, *, resume: bool) -> dict:
    """Train as one rank of a running job; a lost peer ends this process with exit status 3."""
    from tierec.distributed.health import RankLostError
    from tierec.distributed.trainer import DistributedTrainer

    trainer = DistributedTrainer(cfg, run_dir, ctx, resume=resume)
    try:
        summary = trainer.fit()
    except RankLostError as e:
        print(f"tierec: error: rank {ctx.rank}: {e}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(LOST_RANK_STATUS)  # the process group is broken; its teardown could block
    trainer.close()
    return summary
