"""Job: what the training loop asks of the processes it runs on (one, or the ranks of a job).

The loop (tierec/train/trainer.py) is the same for any number of processes; it
delegates to one ``Job`` the few things that depend on it: building the
components (:func:`~tierec.distributed.parallelize.parallelize` on several
processes), this process's slice of a global batch, the loss scale and the job's mean loss, evaluation (each
process scores its slice), footprints summed over the job, the bytes each rank
sends inside its group and across groups, and the heartbeat that names a lost
rank. With one process every piece is the plain one.

The processes' arrangement is one ``layout.Layout`` (``job.parallel``), built
when the job is (a collective on a mesh of several groups) and passed to
``parallelize``. On a 2-D mesh (``dist.group_size``, Hierarchical Training) the
embeddings are sharded over the rank's group (``shard_ctx``), ``after_step`` runs the
cross-group averaging of ``dist.cross_group = "average"``, ``settle`` brings
the replicas together before an evaluation or a pruning step, and ``checkpoint_writers`` makes
a checkpoint one replica's (group 0's ranks write).

>>> from tierec.config import load_config
>>> from tierec.distributed.job import Job
>>> job = Job(load_config(None))
>>> job.ctx.world_size, job.is_main, job.parallel.is_flat
(1, True, True)
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
from tierec.distributed.layout import Layout
from tierec.distributed.parallelize import check_job, for_process, parallelize, sharded_collections
from tierec.distributed import wire

FAIL_ENV = "TIEREC_TEST_FAIL_AT"  # "rank:step": that rank exits abruptly before that step (fault tests)


class Job:
    def __init__(self, cfg: Config, ctx: DistContext | None = None) -> None:
        """``ctx``: the job (default: one process). Every rank of a job builds its ``Job`` at the same point:
        on a mesh of several groups, making the layout's process groups is a collective."""
        self.cfg = cfg
        ctx = ctx if ctx is not None else DistContext.single(cfg.train.device)
        if ctx.is_distributed:
            check_job(cfg, ctx)  # before any group is made: a job cannot run this config
        self.parallel = Layout.build(ctx, cfg.dist.group_size)
        self.is_main = self.ctx.is_main
        self.steps_run = 0
        self._fail_at = _fail_step(self.ctx.rank) if self.ctx.is_distributed else None
        self._parts: Any = None
        self.mesh: Any = None  # hierarchical.Hierarchical on a mesh of several groups, else None
        self._meter: ByteMeter | None = None

    @property
    def ctx(self) -> DistContext:  # the whole job
        return self.parallel.job

    @property
    def distributed(self) -> bool:
        return self.ctx.is_distributed

    # ------------------------------------------------------------ building

    def process_config(self) -> Config:
        """The config this process builds its components from (its own store directory)."""
        return for_process(self.cfg, self.ctx)

    def parallelize(self, parts: Any) -> Any:
        """The components the job trains: ``parts`` itself on one process, new ones made from them on several."""
        if self.distributed:
            parts, self.mesh = parallelize(parts, self.parallel, self.cfg)
            self._meter = ByteMeter(parts, self.parallel, self.mesh)
        self._parts = parts
        return parts

    def layout(self) -> str:
        """One line on how the processes are grouped ("" on one process or one node without a mesh)."""
        cfg = self.cfg.dist
        return self.parallel.describe(cfg.cross_group, cfg.sync_every, cfg.compress)

    @property
    def shard_ctx(self) -> DistContext:
        """The ranks the embeddings are sharded over: this rank's group on a mesh, else the job."""
        return self.parallel.group

    def after_step(self) -> None:
        """After the optimizer step (every rank): the cross-group averaging that is due, the byte meter."""
        if self.mesh is not None:
            self.mesh.after_step()
        if self._meter is not None:
            self._meter.steps += 1

    def settle(self) -> None:
        """Before an evaluation, a checkpoint or a pruning step: on a mesh in ``average`` mode, the replicas
        averaged now (pruning then takes the same decision on every replica: row_sync.RowAverager)."""
        if self.mesh is not None:
            self.mesh.sync_now()

    def resumed_at(self, step: int) -> None:
        """A checkpoint of ``step`` was loaded (the same on every rank)."""
        self.steps_run = step
        if self.mesh is not None:
            self.mesh.resumed_at(step)

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

    def count_step(self) -> None:
        """A training step starts (every rank): counted, so a fault test's planned crash comes at its step."""
        if self._fail_at is not None and self.steps_run + 1 == self._fail_at:
            os._exit(3)  # a crash, as abrupt as a killed process: no cleanup, no goodbye
        self.steps_run += 1

    def local(self, batch: Batch) -> Batch:
        """This process's slice of the global ``batch``, its dense values on the device (ids on the host)."""
        return slice_batch(batch, self.ctx.world_size, self.ctx.rank).to(self.ctx.device)

    def loss_scale(self, batch: Batch) -> float:
        """Multiply the slice's summed loss by this (1/B on one process: the batch mean)."""
        return loss_scale(batch.size, self.ctx.world_size)

    def mean_loss(self, loss_sum: Tensor, batch: Batch) -> float:
        """The global batch's mean loss, from this slice's summed loss (the same on every rank)."""
        total = loss_sum.detach().reshape(1).clone()
        if self.distributed:
            wire.all_reduce(total, self.ctx.dense_group)
        return float(total) / batch.size

    def agree_max(self, value: int) -> int:
        """The largest ``value`` over the job's processes (one tiny all-reduce; itself on one process)."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        wire.all_reduce(t, self.ctx.dense_group, dist.ReduceOp.MAX)
        return int(t)

    def gather_ints(self, value: int) -> list[int]:
        """``value`` of every process, by rank (``[value]`` on one process)."""
        if not self.distributed:
            return [value]
        t = torch.zeros(self.ctx.world_size, dtype=torch.int64)
        t[self.ctx.rank] = value
        wire.all_reduce(t, self.ctx.dense_group)
        return [int(v) for v in t]

    # ------------------------------------------------------------ reports

    def evaluate(self, evaluate_one: Callable[[Config, Any], dict[str, float]], parts: Any, accumulator: Callable) -> dict[str, float]:
        """``evaluate_one(cfg, parts)`` on one process; several: each scores its slice into ``accumulator()``."""
        if not self.distributed:
            return evaluate_one(self.cfg, parts)
        from tierec.distributed.evaluate import evaluate_sharded

        return evaluate_sharded(self.cfg, parts, self.ctx, accumulator)

    def footprint(self, parts: Any) -> dict[str, int]:
        """Rows and bytes of every process's embeddings together (and W on several processes).

        On a mesh: of one replica (the rank's group), with the number of replicas.
        """
        if not self.distributed:
            return {"embedding_rows": parts.embedding_rows(), "embedding_bytes": parts.embedding_bytes()}
        t = torch.tensor([parts.embedding_rows(), parts.embedding_bytes()], dtype=torch.int64)
        wire.all_reduce(t, self.shard_ctx.dense_group)
        out = {"embedding_rows": int(t[0]), "embedding_bytes": int(t[1]), "world_size": self.ctx.world_size,
               "backend": dist.get_backend(self.ctx.dense_group)}  # the dense gradients' (gloo or nccl)
        if self.mesh is not None:
            out["replicas"] = self.parallel.shape.replicas
        return out

    def bytes_postfix(self) -> dict[str, str]:
        """For the progress bar: KiB per step this rank sent so far, inside its group and across groups."""
        if self._meter is None:
            return {}
        inside, across = self._meter.per_step(reset=False)
        return {"in_KiB": f"{inside / 1024:.1f}", "across_KiB": f"{across / 1024:.1f}"}

    def bytes_record(self) -> dict[str, float]:
        """For metrics.jsonl: bytes per step this rank sent since the previous record, inside / across groups."""
        if self._meter is None:
            return {}
        inside, across = self._meter.per_step(reset=True)
        return {"bytes_inside_per_step": round(inside, 1), "bytes_across_per_step": round(across, 1)}

    # ------------------------------------------------------------ checkpoints

    def checkpoint_writers(self) -> DistContext | None:
        """The ranks that write a checkpoint, as the ``ctx`` of ``save_checkpoint`` (every rank calls this).

        The job's own; on a mesh one replica: the replicas agree first (``average``: synced now), then
        group 0's ranks write as a job of g ranks and the other ranks get None (they write nothing).
        """
        if self.mesh is None:
            return self.ctx
        self.mesh.sync_now()
        return self.parallel.group if self.parallel.replica == 0 else None

    def checkpoint_meta(self) -> dict[str, Any]:
        """What a checkpoint's meta records of the job's shape: the mesh it was saved on, if any."""
        if self.mesh is None:
            return {}
        shape = self.parallel.shape
        return {"mesh": {"group_size": shape.group_size, "replicas": shape.replicas}}

    def checkpoint_written(self) -> None:
        """After ``save_checkpoint`` on the writers: on a mesh every replica waits until it is published."""
        if self.mesh is not None:
            self.ctx.barrier()


class ByteMeter:
    """Bytes this rank sends inside its group and across groups (a flat job is one group), per training step.

    The embeddings' exchanges and the cross-group collectives are counted where
    they are sent (``Traffic``); DDP's own all-reduce of the dense gradients,
    issued from C++, is priced as a ring over its process group:
    ``2 (k - 1) / k`` of the gradient bytes per step (k = W flat, g in
    ``average`` mode; in ``gradients`` mode the communication hook counts it).
    """

    def __init__(self, parts: Any, layout: Layout, mesh: Any) -> None:
        self.traffics = [c.traffic for c in sharded_collections(parts)] + ([mesh.traffic] if mesh is not None else [])
        k = layout.world_size if mesh is None else (0 if mesh.gradients else layout.shape.group_size)
        grad_bytes = sum(p.numel() * p.element_size() for p in parts.model.parameters() if p.requires_grad)
        self.ddp_ring = 2 * (k - 1) * grad_bytes / k if k > 1 else 0.0  # bytes per step
        self.steps = 0
        self._mark = (0, 0.0, 0.0)  # (steps, inside, across) at the previous record

    def totals(self) -> tuple[float, float]:
        """(inside, across) bytes sent so far."""
        from tierec.distributed.cross import CROSS

        inside = self.ddp_ring * self.steps
        across = 0.0
        for t in self.traffics:
            for kind, b in t.bytes_sent.items():
                if kind.startswith(CROSS):
                    across += b
                else:
                    inside += b
        return inside, across

    def per_step(self, *, reset: bool) -> tuple[float, float]:
        inside, across = self.totals()
        steps0, inside0, across0 = self._mark if reset else (0, 0.0, 0.0)
        n = max(self.steps - steps0, 1)
        if reset:
            self._mark = (self.steps, inside, across)
        return (inside - inside0) / n, (across - across0) / n


def _fail_step(rank: int) -> int | None:
    spec = os.environ.get(FAIL_ENV, "")
    if not spec:
        return None
    r, s = spec.split(":")
    return int(s) if int(r) == rank else None


def quiet(_: str) -> None:
    """The echo of ranks other than 0."""
