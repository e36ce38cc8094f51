"""DistributedTrainer: the single-process loop, with sharded embeddings and a data-parallel dense part.

It overrides the trainer's pieces, not its loop: every rank reads the same
global batches and keeps its slice (``data.slice_batch``); the embedding
collections are ``ShardedEmbeddingCollection``s over the same (empty) stores
``Components.build`` made; the dense model runs under DistributedDataParallel.
Each rank's loss is its slice's summed loss times W / B, so DDP's average and
the owners' summed embedding gradients are exactly the single-process ones.
Rank 0 prints progress and writes metrics; every rank writes its checkpoint
shard. With ``dist.overlap`` the next batch's ids are sent while this one
computes. A failed collective is diagnosed by the heartbeat (``RankLostError``
names the lost rank) and the job can be resumed from its last checkpoint on
any number of processes.

    torchrun --nproc_per_node 2 -m tierec train --run-dir runs/d2
    tierec train --nproc 2 --run-dir runs/d2          # the same, launched for you
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from tierec.batch import Batch
from tierec.config import Config, ConfigError
from tierec.data import BackgroundLoader, open_source
from tierec.distributed.checkpoint import (
    checkpoint_meta,
    is_sharded,
    iter_shards,
    resolve_checkpoint,
    save_sharded,
)
from tierec.distributed.context import DistContext
from tierec.distributed.data import loss_scale, slice_batch
from tierec.distributed.health import Heartbeat
from tierec.distributed.sharded import ShardedEmbeddingCollection
from tierec.train.checkpoint import Checkpoint
from tierec.train.components import Components
from tierec.train.metrics import EvalAccumulator
from tierec.train.state import restore_checkpoint, restore_state, row_chunks, snapshot_state
from tierec.train.trainer import MetricsLog, Position, Trainer

FAIL_ENV = "TIEREC_TEST_FAIL_AT"  # "rank:step": that rank exits abruptly before that step (fault tests)


def _quiet(_: str) -> None:
    pass


class DistributedTrainer(Trainer):
    def __init__(self, cfg: Config, run_dir: str | Path, ctx: DistContext, *, resume: bool = False,
                 echo: Callable[[str], None] = print) -> None:
        if cfg.prune.enabled or getattr(cfg.store, "enabled", False):
            raise ConfigError("distributed training does not support prune.enabled or store.enabled yet")
        if ctx.device.type != "cpu":
            raise ConfigError(f"distributed training runs on the CPU (gloo) for now, not on {ctx.device}")
        super().__init__(cfg, run_dir, resume=resume, echo=echo if ctx.is_main else _quiet)
        self.ctx = ctx
        self.is_main = ctx.is_main
        self._next: tuple[Batch, Batch] | None = None  # (global, local) batch whose ids are prefetched
        self._upcoming: Batch | None = None  # the global batch after the current one
        self._steps_run = 0
        self._fail_at = _fail_step(ctx.rank)

    def fit(self) -> dict[str, Any]:
        with Heartbeat(self.ctx, self.cfg.dist.heartbeat_s) as beat:
            try:
                summary = super().fit()
            except Exception as e:
                lost = beat.diagnose(e)
                if lost is e:
                    raise
                raise lost from e
        return summary

    # ---------------------------------------------------------- the pieces

    def _build(self, probe) -> Components:
        parts = Components.build(self.cfg, probe.feature_names, probe.n_dense)
        parts.embeddings = ShardedEmbeddingCollection(parts.embeddings, self.ctx, self.cfg.dist)
        if parts.wide is not None:
            parts.wide = ShardedEmbeddingCollection(parts.wide, self.ctx, self.cfg.dist)
        parts.ddp = DistributedDataParallel(parts.model, process_group=self.ctx.dense_group, forward_sync_buffers=False)
        self._parts = parts
        return parts

    def _collections(self, parts: Components) -> list[ShardedEmbeddingCollection]:
        return [c for c in (parts.embeddings, parts.wide) if isinstance(c, ShardedEmbeddingCollection)]

    def _batches(self, loader: BackgroundLoader):
        """The loader's global batches, looking one ahead so that its ids can be prefetched."""
        it = iter(loader)
        cur = next(it, None)
        while cur is not None:
            self._upcoming = next(it, None)
            yield cur
            cur = self._upcoming

    def _local(self, batch: Batch) -> Batch:
        if self._next is not None and self._next[0] is batch:
            return self._next[1]
        return slice_batch(batch, self.ctx.world_size, self.ctx.rank).to(self.cfg.train.device)

    def _step(self, parts: Components, batch: Batch) -> float:
        ctx = self.ctx
        if self._fail_at is not None and self._steps_run + 1 == self._fail_at:
            os._exit(3)  # a crash, as abrupt as a killed process: no cleanup, no goodbye
        parts.train(True)
        local = self._local(batch)
        self._next = None
        if self.cfg.dist.overlap and self._upcoming is not None:
            nxt = slice_batch(self._upcoming, ctx.world_size, ctx.rank).to(self.cfg.train.device)
            self._next = (self._upcoming, nxt)
            for coll in self._collections(parts):
                coll.prefetch(nxt.sparse)
        logits = parts.forward(local)
        loss_sum = F.binary_cross_entropy_with_logits(logits, local.labels, reduction="sum")
        loss = loss_sum * loss_scale(batch.size, ctx.world_size)
        parts.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages dense grads; owners update embedding rows
        parts.optimizer.step()
        total = loss_sum.detach().reshape(1).clone()
        dist.all_reduce(total, group=ctx.dense_group)
        self._steps_run += 1
        return float(total) / batch.size

    def _eval(self, parts: Components, log: MetricsLog, pos: Position, bar, split: str = "test") -> dict[str, float]:
        result = evaluate_sharded(self.cfg, parts, self.ctx, split)
        log.write({"kind": "eval", "split": split, "step": pos.step, **result})
        if self.is_main:
            line = f"step {pos.step}: {split} auc {result['auc']:.4f} logloss {result['logloss']:.4f} ({result['rows']} rows)"
            (bar.write if bar is not None else self.echo)(line)
        return result

    def _footprint(self, parts: Components) -> dict[str, int]:
        """Rows and bytes of every rank's shard together (hot replicas counted once per rank), and W."""
        t = torch.tensor([parts.embedding_rows(), parts.embedding_bytes()], dtype=torch.int64)
        dist.all_reduce(t, group=self.ctx.dense_group)
        return {"embedding_rows": int(t[0]), "embedding_bytes": int(t[1]), "world_size": self.ctx.world_size}

    def _save(self, parts: Components, ckpt_dir: Path, pos: Position) -> None:
        from tierec.config import to_dict

        tensors, skeleton = snapshot_state(parts)
        meta = {"position": vars(pos).copy(), "state": skeleton, "config": to_dict(self.cfg)}
        save_sharded(self.ctx, ckpt_dir, pos.step, tensors, meta, rows=row_chunks(parts))  # rows streamed

    def _load(self, parts: Components, ckpt_dir: Path) -> Position:
        ckpt = resolve_checkpoint(ckpt_dir)
        if ckpt is None:
            self.echo(f"no checkpoint in {ckpt_dir}; starting from scratch")
            return Position()
        if is_sharded(ckpt):
            meta = checkpoint_meta(ckpt)
            for i, shard in enumerate(iter_shards(ckpt)):  # every rank reads every shard, keeps its rows
                if i == 0:
                    restore_state(parts, shard, meta["state"])
                else:
                    _load_rows(parts, shard)
        else:  # saved on any number of processes: every rank reads every chunk, keeps its rows
            loaded = Checkpoint(ckpt)
            restore_checkpoint(parts, loaded, self.ctx.rank, self.ctx.world_size)
            meta = loaded.meta
        pos = Position(**meta["position"])
        self._steps_run = pos.step
        self.echo(f"resumed from step {pos.step} (epoch {pos.epoch}, batch {pos.batch_in_epoch}) on {self.ctx.world_size} ranks")
        return pos

    def _stop_requested(self) -> int | None:
        """A signal seen by any rank stops every rank after the same step (one tiny all-reduce per step)."""
        if self.stop is None:
            return None
        t = torch.tensor([self.stop.requested or 0], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ctx.dense_group)
        return int(t) or None

    def close(self) -> None:
        for coll in self._collections(self._parts):
            coll.close()


def _load_rows(parts: Components, tensors: dict[str, torch.Tensor]) -> None:
    from tierec.train.state import embedding_collections

    for name, coll in embedding_collections(parts):
        prefix = f"{name}/"
        coll.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})


def _fail_step(rank: int) -> int | None:
    spec = os.environ.get(FAIL_ENV, "")
    if not spec:
        return None
    r, s = spec.split(":")
    return int(s) if int(r) == rank else None


def evaluate_sharded(cfg: Config, parts: Components, ctx: DistContext, split: str = "test") -> dict[str, float]:
    """The single-process ``evaluate``: each rank scores its slice, every rank gets all scores in order."""
    source = open_source(cfg.data, split, cfg.train.batch_size)
    acc = EvalAccumulator()
    was_training = parts.model.training
    parts.train(False)
    try:
        with torch.no_grad(), BackgroundLoader(source, depth=cfg.data.prefetch_batches) as loader:
            for i, batch in enumerate(loader):
                if cfg.train.eval_batches and i >= cfg.train.eval_batches:
                    break
                local = slice_batch(batch, ctx.world_size, ctx.rank).to(cfg.train.device)
                acc.update(_gather_slices(parts.forward(local).cpu(), batch.size, ctx), batch.labels)
    finally:
        parts.train(was_training)
    return acc.compute()


def _gather_slices(mine: torch.Tensor, total: int, ctx: DistContext) -> torch.Tensor:
    """Every rank's slice of a [total] vector, concatenated in rank order (on every rank)."""
    from tierec.distributed.data import slice_bounds

    if not ctx.is_distributed:
        return mine
    size = slice_bounds(total, ctx.world_size, 0)[1]  # rank 0's slice is the largest
    padded = torch.zeros(size, dtype=mine.dtype)
    padded[: mine.shape[0]] = mine
    every = torch.empty(ctx.world_size * size, dtype=mine.dtype)
    dist.all_gather_single(every, padded, group=ctx.dense_group)
    parts = []
    for r in range(ctx.world_size):
        lo, hi = slice_bounds(total, ctx.world_size, r)
        parts.append(every[r * size : r * size + hi - lo])
    return torch.cat(parts)
