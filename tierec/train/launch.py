"""``tierec train`` on several processes: under torchrun, or as the N local ranks of ``--nproc N``.

``run_train`` is what the command line calls with ``--nproc N`` (or inside
torchrun); ``train_in_job`` is one rank's training in a running job (tests
start it on spawned processes, tierec/distributed/launch.py).

>>> from tierec.train.launch import LOST_RANK_STATUS
>>> LOST_RANK_STATUS  # every surviving rank's exit status when a peer is lost
3
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable

import torch.distributed as dist

from tierec.config import Config, ConfigError
from tierec.distributed.context import DistContext
from tierec.distributed.launch import die_with_parent
from tierec.distributed.local_job import LAUNCHER_ENV, LOST_RANK_STATUS, report_error, rank_command, run_local_job
from tierec.train.checkpoint import CheckpointError
from tierec.train.stopping import GracefulStop, Interrupted, TrainingDiverged


def _with_run_dir(argv: list[str], run_dir: Path) -> list[str]:
    if any(a == "--run-dir" or a.startswith("--run-dir=") for a in argv):
        return argv
    return [*argv, "--run-dir", str(run_dir)]


def run_train(
    cfg: Config, run_dir: Path, *, resume: bool, nproc: int, argv: list[str], report: Callable[[dict], None],
    overwrite: bool = False,
) -> int:
    """``tierec train`` on several processes; returns the exit status.

    Outside a job (``--nproc N``) it checks what a job of N processes cannot run (one line, exit 2, before
    any rank starts), then starts the same command as N local ranks with the run directory fixed, and
    waits (``run_local_job``): the ranks die with the launcher (PR_SET_PDEATHSIG), a SIGINT, SIGTERM or
    SIGHUP the launcher gets goes to the ranks, a rank that dies takes the others down in one line, and
    the ranks' one-line errors are printed once. Inside a job it joins it, checks that every rank
    has the same config, rank 0 claims the run directory, and every rank trains;
    rank 0 reports. A lost rank ends every other rank with one line naming it and
    exit status 3; a config or run-directory error ends every rank with exit 2.
    """
    from tierec.distributed.config_check import check_job_config, check_same_config
    from tierec.distributed.context import init_distributed, launched_by_torchrun

    if not launched_by_torchrun():
        if nproc <= 1:
            raise ValueError("run_train needs --nproc > 1 or a torchrun environment")
        check_job_config(cfg, nproc)
        return run_local_job(rank_command(_with_run_dir(argv, run_dir)), nproc, run_dir, signals=GracefulStop.SIGNALS)

    die_with_parent(signal.SIGKILL)  # its parent (torchrun, or the launcher) gone: so is this rank
    # Signals are caught from here on: one during setup stops the run after its first step, with a checkpoint.
    with GracefulStop(announce=os.environ.get("RANK", "0") == "0") as stop:
        ctx = init_distributed(cfg.dist, cfg.train.device, threads=cfg.train.threads)
        try:
            check_same_config(cfg, ctx.rank, ctx.world_size, group=ctx.dense_group)
            shared = [str(run_dir)]
            dist.broadcast_object_list(shared, src=0, group=ctx.dense_group)  # a default run dir names rank 0's clock
            with _claimed(ctx, Path(shared[0]), resume=resume, overwrite=overwrite):
                summary = train_in_job(ctx, cfg, Path(shared[0]), resume=resume, stop=stop)
        except (ConfigError, CheckpointError, TrainingDiverged, Interrupted) as e:
            # the same on every rank: exit without tearing down the group (it can block)
            if isinstance(e, Interrupted):
                if ctx.is_main:
                    print(f"tierec: {e}", file=sys.stderr, flush=True)
            else:
                report_error(f"tierec: error: {e}")
            sys.stdout.flush()
            os._exit(interrupted_status(e) if isinstance(e, Interrupted) else 2)
    ctx.close()
    if ctx.is_main:
        report(summary)
    return 0


def interrupted_status(e: Interrupted) -> int:
    """A rank's exit status after a signal: 0 under `--nproc N` (its launcher reports 130 / 143), else e.status."""
    return 0 if os.environ.get(LAUNCHER_ENV) else e.status


@contextmanager
def _claimed(ctx: DistContext, run_dir: Path, *, resume: bool, overwrite: bool) -> Iterator[None]:
    """Rank 0 claims (locks) the run directory for the job; every rank learns whether it could."""
    from tierec.train.rundir import claim_run_dir

    with ExitStack() as stack:
        problem = [""]
        if ctx.is_main:
            try:
                stack.enter_context(claim_run_dir(run_dir, resume=resume, overwrite=overwrite))
            except ConfigError as e:
                problem = [str(e)]
        dist.broadcast_object_list(problem, src=0, group=ctx.dense_group)
        if problem[0]:
            raise ConfigError(problem[0])
        yield


def train_in_job(ctx: DistContext, cfg: Config, run_dir: Path, *, resume: bool, stop: GracefulStop | None = None) -> dict:
    """Train as one rank of a running job; a lost peer ends this process with exit status 3."""
    from tierec.distributed.health import RankLostError
    from tierec.train.trainer import Trainer

    trainer = Trainer(cfg, run_dir, resume=resume, ctx=ctx)
    trainer.stop = stop
    try:
        summary = trainer.fit()
    except RankLostError as e:
        report_error(f"tierec: error: rank {ctx.rank}: {e}")
        sys.stdout.flush()
        os._exit(LOST_RANK_STATUS)  # the process group is broken; its teardown could block
    trainer.close()
    return summary
