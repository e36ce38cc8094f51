"""Job: what the training loop asks of the processes it runs on (one, or the ranks of a job).

The loop (tierec/train/trainer.py) is the same for any number of processes; it
delegates to one ``Job`` the few things that depend on it: building the
components (:func:`~tierec.distributed.parallelize.parallelize` on several
processes), this process's slice of a global batch (and starting the next
batch's id exchange), the loss scale and the job's mean loss, evaluation (each
process scores its slice), footprints summed over the job, and the heartbeat that names a lost rank. With
one process every piece is the plain one.

>>> from tierec.config import load_config
>>> from tierec.distributed.job import Job
>>> job = Job(load_config(None))
>>> job.ctx.world_size, job.is_main
(1, True)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor

from tierec.batch import Batch
from tierec.config import Config
from tierec.distributed.context import DistContext
from tierec.distributed.data import loss_scale, slice_batch
from tierec.distributed.parallelize import for_process, parallelize, sharded_collections

FAIL_ENV = "TIEREC_TEST_FAIL_AT"  # "rank:step": that rank exits abruptly before that step (fault tests)


class Job:
    def __init__(self, cfg: Config, ctx: DistContext | None = None) -> None:
        self.cfg = cfg
        self.ctx = ctx if ctx is not None else DistContext.single(cfg.train.device)
        self.is_main = self.ctx.is_main
        self._next: tuple[Batch, Batch] | None = None  # (global, local) batch whose ids are prefetched
        self._upcoming: Batch | None = None  # the global batch after the current one
        self.steps_run = 0
        self._fail_at = _fail_step(self.ctx.rank) if self.ctx.is_distributed else None
        self._parts: Any = None

    @property
    def distributed(self) -> bool:
        return self.ctx.is_distributed

    # ------------------------------------------------------------ building

    def process_config(self) -> Config:
        """The config this process builds its components from (its own store directory)."""
        return for_process(self.cfg, self.ctx)

    def parallelize(self, parts: Any) -> Any:
        if self.distributed:
            parallelize(parts, self.ctx, self.cfg)
        self._parts = parts
        return parts

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Around the whole run: a heartbeat on several processes, so a lost rank is named."""
        if not self.distributed:
            yield
            return
        from tierec.distributed.health import Heartbeat

        with Heartbeat(self.ctx, self.cfg.dist.heartbeat_s) as beat:
            try:
                yield
            except Exception as e:
                lost = beat.diagnose(e)
                if lost is e:
                    raise
                raise lost from e

    # ------------------------------------------------------------ the step

    def batches(self, loader: Any) -> Iterator[Batch]:
        """The loader's global batches; with ``dist.overlap`` looking one ahead so its ids can be sent early."""
        if not (self.distributed and self.cfg.dist.overlap):
            yield from loader
            return
        it = iter(loader)
        cur = next(it, None)
        while cur is not None:
            self._upcoming = next(it, None)
            yield cur
            cur = self._upcoming

    def local(self, batch: Batch, parts: Any) -> Batch:
        """This process's slice of ``batch`` on the device; starts exchanging the next batch's ids."""
        if self._fail_at is not None and self.steps_run + 1 == self._fail_at:
            os._exit(3)  # a crash, as abrupt as a killed process: no cleanup, no goodbye
        self.steps_run += 1
        ctx, device = self.ctx, self.cfg.train.device
        if self._next is not None and self._next[0] is batch:
            local = self._next[1]
        else:
            local = slice_batch(batch, ctx.world_size, ctx.rank).to(device)
        self._next = None
        if self._upcoming is not None:
            nxt = slice_batch(self._upcoming, ctx.world_size, ctx.rank).to(device)
            self._next = (self._upcoming, nxt)
            for coll in sharded_collections(parts):
                coll.prefetch(nxt.sparse)
        return local

    def loss_scale(self, batch: Batch) -> float:
        """Multiply the slice's summed loss by this (1/B on one process: the batch mean)."""
        return loss_scale(batch.size, self.ctx.world_size)

    def mean_loss(self, loss_sum: Tensor, batch: Batch) -> float:
        """The global batch's mean loss, from this slice's summed loss (the same on every rank)."""
        total = loss_sum.detach().reshape(1).clone()
        if self.distributed:
            dist.all_reduce(total, group=self.ctx.dense_group)
        return float(total) / batch.size

    def agree_max(self, value: int) -> int:
        """The largest ``value`` over the job's processes (one tiny all-reduce; itself on one process)."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ctx.dense_group)
        return int(t)

    # ------------------------------------------------------------ reports

    def evaluate(self, evaluate_one: Callable[[Config, Any], dict[str, float]], parts: Any, accumulator: Callable) -> dict[str, float]:
        """``evaluate_one(cfg, parts)`` on one process; several: each scores its slice into ``accumulator()``."""
        if not self.distributed:
            return evaluate_one(self.cfg, parts)
        from tierec.distributed.evaluate import evaluate_sharded

        return evaluate_sharded(self.cfg, parts, self.ctx, accumulator)

    def footprint(self, parts: Any) -> dict[str, int]:
        """Rows and bytes of every process's embeddings together (and W on several processes)."""
        if not self.distributed:
            return {"embedding_rows": parts.embedding_rows(), "embedding_bytes": parts.embedding_bytes()}
        t = torch.tensor([parts.embedding_rows(), parts.embedding_bytes()], dtype=torch.int64)
        dist.all_reduce(t, group=self.ctx.dense_group)
        return {"embedding_rows": int(t[0]), "embedding_bytes": int(t[1]), "world_size": self.ctx.world_size}

    def close(self) -> None:
        """Wait out id exchanges that no forward will use (before leaving the job)."""
        if self._parts is not None:
            for coll in sharded_collections(self._parts):
                coll.close()


def _fail_step(rank: int) -> int | None:
    spec = os.environ.get(FAIL_ENV, "")
    if not spec:
        return None
    r, s = spec.split(":")
    return int(s) if int(r) == rank else None


def quiet(_: str) -> None:
    """The echo of ranks other than 0."""
