"""The training loop: load, loop over steps, evaluate, save.

A run directory holds ``config.toml`` (the resolved config), ``metrics.jsonl``
(one JSON object per line: train, eval and final records), ``checkpoints/``
and ``summary.json``. ``resume=True`` continues from the newest checkpoint and
ends with the same weights as an uninterrupted run: the data order is a pure
function of (seed, epoch, batch), and every piece of state (embedding rows and
optimizer state, dense model and optimizer, RNG) is in the checkpoint.

>>> from tierec.config import load_config
>>> from tierec.train.trainer import Trainer
>>> cfg = load_config(None, ["data.synthetic.train_rows=4096", "data.synthetic.test_rows=1024",
...                          "train.batch_size=1024", "train.progress=false"])
>>> import tempfile; summary = Trainer(cfg, tempfile.mkdtemp(), echo=lambda _: None).fit()  # echo: where lines go
>>> summary["steps"]
4
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

import torch
import torch.nn.functional as F
from tqdm import tqdm

from tierec.config import Config, to_dict
from tierec.errors import ConfigError
from tierec.data import Dataset, open_dataset
from tierec.distributed.context import DistContext
from tierec.distributed.job import Job, quiet
from tierec.store.monitor import StoreMonitor
from tierec.train.allocator import keep_heap
from tierec.train.checkpoint import Checkpoint, CheckpointError, checkpoint_dirs, save_checkpoint
from tierec.train.components import Components
from tierec.train.dense_stats import fit_to_training_split
from tierec.train.evaluate import BEST_DIR, evaluate, has_validation, planted_auc, require_defined, with_validation
from tierec.train.metrics import EvalAccumulator
from tierec.train.passes import EpochPasses, FollowPasses, resolve_format
from tierec.train.pipeline import TrainPipeline
from tierec.train.runfiles import RunFiles
from tierec.train.sharded_checkpoint import is_sharded, restore_sharded
from tierec.train.delta import apply_deltas, save_delta
from tierec.train.state import (
    delta_state,
    load_shard_rows,
    mark_changes,
    restore_checkpoint,
    restore_delta,
    restore_state,
    row_chunks,
    snapshot_state,
    track_changes,
)
from tierec.train.stopping import GracefulStop, Interrupted, TrainingDiverged
from tierec.train.tensorboard import TensorBoardSink
from tierec.threads import use_threads
from tierec.version import tierec_version
from tomli_w import dumps as dump_toml


@dataclass
class Position:
    """Where the loop is: global step, epoch, and batches done within the epoch."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_auc: float = -1.0  # best validation AUC so far (-1: none yet)
    best_step: int = -1
    evals_since_best: int = 0  # for train.early_stop_patience


class MetricsLog:
    """Append-only JSON lines to ``out`` (a no-op without one: ranks other than 0 of a job), copied to ``sink``
    (TensorBoard with ``train.tensorboard``) when there is one."""

    def __init__(self, out: TextIO | None, sink: Any = None) -> None:
        self.out = out
        self.sink = sink if out is not None else None

    def write(self, record: dict[str, Any]) -> None:
        if self.out is None:
            return
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()  # a record is on disk (the page cache) when the step is done, even if the process dies
        if self.sink is not None:
            self.sink.write(record)

    def close(self) -> None:
        if self.out is not None:
            self.out.close()
        if self.sink is not None:
            self.sink.close()


def _prune_postfix(parts: Components) -> dict[str, str]:
    """With pruning: allocated embedding bytes and chunks pruned / regrown so far, for the progress bar."""
    if parts.pruner is None:
        return {}
    pruned, regrown = parts.pruner.counts()
    return {"emb_MB": f"{parts.embedding_bytes() / 2**20:.1f}", "pruned": str(pruned), "regrown": str(regrown)}


def peak_memory_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # ru_maxrss is KiB on Linux


def load_newest_intact(ckpt_dir: Path, restore: Callable[[Path], dict], echo: Callable[[str], None]) -> dict:
    """Restore the newest checkpoint that loads whole; a corrupt newer one is reported and skipped. Returns its meta."""
    failures: list[str] = []
    for ckpt in checkpoint_dirs(ckpt_dir):
        try:
            meta = restore(ckpt)
        except CheckpointError as e:
            failures.append(str(e))
            echo(f"{e}; trying an older checkpoint")
            continue
        if failures:
            echo(f"resuming from {ckpt.name}, the newest intact checkpoint")
        return meta
    raise CheckpointError(f"no intact checkpoint in {ckpt_dir} ({len(failures)} tried; newest: {failures[0]})")


class Trainer:
    def __init__(
        self, cfg: Config, run_dir: str | Path, *, resume: bool = False, echo: Callable[[str], None] = print,
        ctx: DistContext | None = None, on_validation: Callable[[int, float], bool] | None = None,
        test_at_end: bool = True,
    ) -> None:
        """``ctx``: the job this process is a rank of (default: one process). The loop is the same
        for any number of processes; what differs is applied by ``self.job`` (tierec/distributed/job.py).

        ``on_validation`` (a caller that watches the run, `tierec tune`): called with (step, validation AUC)
        after every validation; True stops the run there, as an early stop does. ``test_at_end = False``
        leaves the test split unread (a tuning trial sees validation only; its summary has no test_* keys)."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.files = RunFiles(self.run_dir)  # every file written in the run directory goes through it
        self.resume = resume
        self.job = Job(cfg, ctx)
        self.is_main = self.job.is_main  # prints progress and writes run files (rank 0 of a job)
        self.echo = echo if self.is_main else quiet
        self._validated_at = -1  # step of the latest validation
        self._published: tuple[int, int] | None = None  # (full checkpoint, last publication): what a delta follows
        self._saved_at: dict[str, Any] | None = None  # the position of the latest full checkpoint
        self.stop: GracefulStop | None = None  # set by the caller to stop cleanly on SIGINT / SIGTERM
        self._pipe: TrainPipeline | None = None
        self._data: Dataset | None = None  # the training data, opened once by the loop
        self.on_validation = on_validation
        self.test_at_end = test_at_end
        self._halted = False
        self._passes: EpochPasses | FollowPasses | None = None  # what the loop trains (set when it starts)

    # ------------------------------------------------------------------ fit

    def fit(self) -> dict[str, Any]:
        with self.job.guard():  # several processes: a lost rank is named
            return self._fit()

    def close(self) -> None:
        """After a run that stopped early (an interrupt): the pipeline's stages and pending id exchanges end."""
        if self._pipe is not None:
            self._pipe.close()

    def _fit(self) -> dict[str, Any]:
        self.cfg = cfg = with_validation(self.cfg)
        if cfg.data.follow:
            if self.job.ctx.world_size > 1:
                raise ConfigError("data.follow runs on 1 process for now; train a followed directory with --nproc 1")
            resolved = resolve_format(cfg, self._stopping, self.echo)
            if resolved is None:
                self._stopped_waiting()
            self.cfg = cfg = resolved
        if cfg.train.threads:
            use_threads(cfg.train.threads)
        keep_heap()  # reuse freed activation buffers instead of page-faulting them in every step
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.is_main:
            self.files.write_text("config.toml", dump_toml(to_dict(cfg)))
        metrics = self.files.append("metrics.jsonl") if self.is_main else None
        sink = TensorBoardSink(self.run_dir) if cfg.train.tensorboard and self.is_main else None
        log = MetricsLog(metrics, sink=sink)
        try:
            return self._loop(cfg, log)
        finally:
            if self._pipe is not None:  # a run that ended on an error: its threads stop (id exchanges: close())
                self._pipe.stop()
            log.close()

    def _loop(self, cfg: Config, log: MetricsLog) -> dict[str, Any]:
        ckpt_dir = self._own_dir("checkpoints")

        # 1. data and model
        self._data = data = open_dataset(cfg.data)  # opened once: every epoch and evaluation reads through it
        bar: tqdm | None = None
        say = lambda line: self.echo(line) if bar is None or bar.disable else bar.write(line)  # noqa: E731
        self._passes = passes = FollowPasses(cfg, self._stopping, say) if cfg.data.follow else EpochPasses(cfg, data)
        probe = passes.probe()
        if probe is None:
            self._stopped_waiting()
        parts = self._build(probe)
        pos = Position()
        if self.resume and checkpoint_dirs(ckpt_dir):
            pos, meta = self._load(parts, ckpt_dir)  # the model's dense scaling comes with it
            passes.load(meta)
        else:
            if self.resume:
                self.echo(f"no checkpoint in {ckpt_dir}; starting from scratch")
            fit_to_training_split(cfg, parts, probe, self.echo)  # one pass over the head of the training split
        if cfg.train.delta_every:
            if self.job.mesh is not None:  # replicas of groups: group 0 writes, averaging moves rows unnoted
                raise ConfigError("train.delta_every does not run on a mesh of groups yet; set dist.group_size = 0 or delta_every = 0")
            track_changes(parts)  # from here on: changes since the publication resumed from, or since the start
        total = passes.total_steps(probe)  # None: a followed directory, until stopped
        end = math.inf if total is None else total
        record_every = max(1, min(50, total // 100)) if total is not None else 50  # every 50 steps, or 100 records in all
        store = StoreMonitor.for_components(parts, cfg.store)  # tiered tables: prefetch pipeline, statistics
        if store.describe() and self.job.is_main:
            self.echo(store.describe())
        self._pipe = pipe = TrainPipeline(parts, self.job, cfg, store)  # what runs ahead of each step, and where
        if pipe.describe() and self.job.is_main:
            self.echo(pipe.describe())  # before the progress bar starts, as the store's line

        # 2. loop over steps
        # A terminal gets a live bar; a log file gets a line every 30 s at most.
        interactive = sys.stderr.isatty()
        bar = tqdm(
            total=total,
            initial=pos.step,
            disable=not (cfg.train.progress and self.is_main),
            unit="step",
            dynamic_ncols=interactive,
            mininterval=0.5 if interactive else 30.0,
        )
        # samples/s leave out this process's first step (the kernels' compilation on a new install, the first
        # allocations); the final loss is the last full batch's (an epoch's short last batch is noisier)
        samples, busy, last_loss, full_loss = 0, 0.0, float("nan"), float("nan")
        first: tuple[int, float] | None = None  # (samples, seconds) of the first step, used only if it stays the only one
        eval_split = "validation" if has_validation(cfg.data) else "test"
        done = pos.step >= end
        while not done:
            source = passes.source(pos.epoch, pos.batch_in_epoch, pos.step)
            if source is None:  # a stop was asked for while a followed directory had no new file
                self._interrupt(parts, ckpt_dir, pos, bar, log)
            with closing(pipe.run(source, quiet=lambda: self._quiet_after(pos.step + 1, end, parts))) as steps:
                for step in steps:
                    t0 = time.perf_counter()
                    batch, last_loss = step.batch, step.loss
                    self._check_loss(last_loss, pos, ckpt_dir)
                    pruning = parts.pruner is not None and parts.pruner.due(pos.step + 1)
                    if pruning:
                        self.job.settle()  # on a mesh in average mode a pruning step is a sync point
                        parts.pruner.step()  # its cost counts in the throughput
                    if first is None:
                        first = (batch.size, step.seconds + time.perf_counter() - t0)
                    else:
                        busy += step.seconds + time.perf_counter() - t0
                        samples += batch.size
                    if batch.size == cfg.train.batch_size:
                        full_loss = last_loss
                    pos.step += 1
                    pos.batch_in_epoch += 1
                    rate = samples / busy if busy else first[0] / max(first[1], 1e-9)
                    bar.update(1)
                    rows = parts.embedding_rows()
                    bar.set_postfix(loss=f"{last_loss:.4f}", samples_s=f"{rate:,.0f}", rows=f"{rows:,}", refresh=False, **_prune_postfix(parts), **store.postfix(), **self.job.bytes_postfix())
                    if pruning:
                        self._log_prune(parts, log, pos, bar)
                    if pos.step % record_every == 0 or pos.step == end:
                        log.write({"kind": "train", "step": pos.step, "loss": last_loss, "samples_per_s": rate,
                                   "samples": samples, "busy_s": round(busy, 6), "embedding_rows": rows,
                                   "embedding_bytes": parts.embedding_bytes(), **store.record(), **self.job.bytes_record()})
                    if cfg.train.eval_every and pos.step % cfg.train.eval_every == 0 and pos.step < end:
                        self._track_best(parts, self._eval(parts, log, pos, bar, eval_split), pos, eval_split)
                        done = bool(cfg.train.early_stop_patience) and pos.evals_since_best >= cfg.train.early_stop_patience
                        if done:
                            (bar.write if bar is not None else self.echo)(f"step {pos.step}: early stop, no better validation AUC in {pos.evals_since_best} evaluations")
                        elif self._halted:
                            done = True
                            (bar.write if bar is not None else self.echo)(f"step {pos.step}: stopped by its caller (on_validation)")
                    if cfg.train.checkpoint_every and pos.step % cfg.train.checkpoint_every == 0:
                        self._save_full(parts, ckpt_dir, pos)
                    elif cfg.train.delta_every and pos.step % cfg.train.delta_every == 0:
                        self._save_delta(parts, ckpt_dir, pos)
                    if not pipe.ahead_pending and self._stop_requested():  # else the batch looked up ahead first
                        self._interrupt(parts, ckpt_dir, pos, bar, log)
                    if done or pos.step >= end:
                        done = True
                        break
            if not done:
                passes.finished()
                pos.epoch += 1
                pos.batch_in_epoch = 0
                if passes.publishes_each_pass and cfg.train.delta_every and (self._published or (-1, -1))[1] < pos.step:
                    self._save_delta(parts, ckpt_dir, pos)  # what the file taught, served before the next file comes
        bar.close()
        pipe.close()
        if parts.pruner is not None and cfg.prune.final_prune and first is not None and not parts.pruner.due(pos.step):
            self.job.settle()
            parts.pruner.step()  # the evaluated and saved model meets the budget too
            self._log_prune(parts, log, pos, None)
            self._saved_at = None  # the rows changed since

        # 3. save; keep the best by validation AUC; evaluate test on it
        best: dict[str, Any] = {}
        result = None
        if eval_split != "validation" and (not cfg.data.follow or cfg.data.test_source):  # (evaluate, then save)
            result = self._eval(parts, log, pos, None, "test")
        if self._saved_at != vars(pos):  # not saved at this very point already (a last step that checkpointed)
            self._save_full(parts, ckpt_dir, pos)
        if eval_split == "validation":
            if self._validated_at != pos.step:  # (an early stop has just evaluated this step)
                self._track_best(parts, self._eval(parts, log, pos, None, "validation"), pos, "validation")
            best = {"best_step": pos.best_step, "best_validation_auc": pos.best_auc}
            result = None
            if self.test_at_end:
                if pos.best_step != pos.step:
                    self._load_weights(parts, ckpt_dir / BEST_DIR)
                result = self._eval(parts, log, pos, None, "test")
        tested = {} if result is None else {"test_auc": result["auc"], "test_logloss": result["logloss"], "test_rows": result["rows"]}
        summary = {
            "tierec_version": tierec_version(),
            "steps": pos.step,
            **best,
            **tested,
            "train_samples_per_s": samples / busy if busy else (first[0] / max(first[1], 1e-9) if first else float("nan")),
            "final_train_loss": full_loss if full_loss == full_loss else last_loss,
            **self._footprint(parts),
            **store.summary(),
            "peak_memory_bytes": peak_memory_bytes(),
            "run_dir": str(self.run_dir),
        }
        if self.job.distributed:  # every process's own peak (rank 0's is the one above)
            summary["peak_memory_bytes_per_process"] = self.job.gather_ints(summary["peak_memory_bytes"])
        if parts.pruner is not None:
            summary["prune"] = parts.pruner.stats()
        if result is not None and (cfg.data.source == "synthetic" or cfg.data.format == "synthetic"):
            summary["planted_auc"] = planted_auc(cfg, result["rows"])
        log.write({"kind": "final", **summary})
        if self.is_main:
            self.files.write_text("summary.json", json.dumps(summary, indent=2) + "\n")
        if result is not None:
            require_defined(result, f"the test split of {cfg.data.test_source or cfg.data.source}")  # after saving: exit 2, never 0
        return summary

    # ------------------------------------------------------------- pieces

    def _own_dir(self, name: str) -> Path:
        """A directory of the run (created, checked not to be a link or the user's, on the writing rank)."""
        return self.files.directory(name) if self.is_main else self.run_dir / name

    def _passes_meta(self) -> dict[str, Any]:
        """What a checkpoint records of the passes (a followed directory: the files done)."""
        return self._passes.checkpoint_meta() if self._passes is not None else {}

    def _stopping(self) -> bool:
        return self._stop_requested() is not None

    def _stopped_waiting(self) -> None:
        """A run stopped before the followed directory gave it a first file: nothing was trained."""
        raise Interrupted(self._stop_requested() or 0, f"stopped while waiting for a first file in {self.cfg.data.source}; "
                                                       "nothing was trained")  # fmt: skip

    def _quiet_after(self, step: int, end: float, parts: Components) -> bool:
        """Nothing uses the tables between training step ``step`` (1-based) and the next: no evaluation,
        checkpoint, delta, pruning, stop or end (the pipeline may then look the next batch up ahead)."""
        t = self.cfg.train
        busy = (
            step >= end
            or bool(t.eval_every and step % t.eval_every == 0)
            or bool(t.checkpoint_every and step % t.checkpoint_every == 0)
            or bool(t.delta_every and step % t.delta_every == 0)
            or (parts.pruner is not None and parts.pruner.due(step))
            or (self.stop is not None and bool(self.stop.requested))
        )
        return not busy

    def _stop_requested(self) -> int | None:
        """The signal that asked the run to stop (all ranks agree in a job), or None."""
        if self.stop is None:
            return None
        return self.job.agree_max(self.stop.requested or 0) or None

    def _interrupt(self, parts: Components, ckpt_dir: Path, pos: Position, bar: tqdm, log: MetricsLog) -> None:
        signum = self._stop_requested()
        bar.close()
        self._save_full(parts, ckpt_dir, pos)
        log.write({"kind": "interrupted", "step": pos.step, "signal": signum})
        raise Interrupted(signum, f"interrupted at step {pos.step}; checkpoint saved in {ckpt_dir}; "
                                  f"continue with `tierec train --run-dir {self.run_dir} --resume`")

    def _check_loss(self, loss: float, pos: Position, ckpt_dir: Path) -> None:
        if math.isfinite(loss) or self.cfg.train.nan_policy != "stop":
            return
        kept = checkpoint_dirs(ckpt_dir)
        where = f"it resumes from {kept[0].name}" if kept else "no checkpoint was written yet"
        raise TrainingDiverged(
            f"step {pos.step + 1}: the training loss is {loss}; stopped (train.nan_policy = \"stop\"); {where}; "
            "a lower embedding.optimizer.lr or train.dense_lr usually helps"
        )

    def _build(self, probe) -> Components:
        """The components, parallelized over the job (sharded embeddings, DDP) when there are several processes."""
        parts = Components.build(self.job.process_config(), probe.feature_names, probe.n_dense)
        parts = self.job.parallelize(parts)
        if self.job.layout():
            self.echo(self.job.layout())
        return parts

    def _footprint(self, parts: Components) -> dict[str, int]:
        return self.job.footprint(parts)

    def _log_prune(self, parts: Components, log: MetricsLog, pos: Position, bar: tqdm | None) -> None:
        """A "prune" metrics record, and one progress line: bytes, chunks pruned / regrown, rows per dim."""
        stats = parts.pruner.stats()
        log.write({"kind": "prune", "step": pos.step, "threshold": parts.pruner.last.threshold, **stats})
        if self.cfg.train.progress:
            mb = 2.0**-20
            line = (
                f"step {pos.step}: pruned {stats['pruned_chunks']} / regrown {stats['regrown_chunks']} chunks so far; "
                f"embedding {stats['embedding_bytes'] * mb:.1f} MB, values {stats['allocated_value_bytes'] * mb:.1f} MB "
                f"(target {stats['target_bytes'] * mb:.1f}); rows per dim {stats['dim_hist']}"
            )
            (bar.write if bar is not None else self.echo)(line)

    def _eval(self, parts: Components, log: MetricsLog, pos: Position, bar: tqdm | None, split: str = "test") -> dict[str, float]:
        self.job.settle()  # on a mesh: the replicas agree first
        if self.job.distributed:
            from tierec.distributed.evaluate import evaluate_sharded

            result = evaluate_sharded(self.cfg, parts, self.job.ctx, EvalAccumulator, split, self._data)
        else:
            result = evaluate(self.cfg, parts, split, self._data)
        log.write({"kind": "eval", "split": split, "step": pos.step, **result})
        line = f"step {pos.step}: {split} auc {result['auc']:.4f} logloss {result['logloss']:.4f} ({result['rows']} rows)"
        if self.is_main:
            (bar.write if bar is not None else self.echo)(line)
        return result

    def _track_best(self, parts: Components, result: dict[str, float], pos: Position, split: str) -> None:
        """Keep checkpoints/best at the best validation AUC so far (periodic evaluations on test keep nothing)."""
        if split != "validation":
            return
        self._validated_at = pos.step
        if result["auc"] > pos.best_auc or pos.best_step < 0:  # a nan AUC never wins, but a first one is kept
            pos.best_auc = float(result["auc"]) if result["auc"] == result["auc"] else -1.0
            pos.best_step, pos.evals_since_best = pos.step, 0
            self._save(parts, self._own_dir(f"checkpoints/{BEST_DIR}"), pos)
        else:
            pos.evals_since_best += 1
        if self.on_validation is not None and self.on_validation(pos.step, float(result["auc"])):
            self._halted = True

    def _load_weights(self, parts: Components, ckpt_dir: Path) -> None:
        """The state of the checkpoint in ``ckpt_dir`` (the best one), without a word."""
        echo, self.echo = self.echo, lambda _: None
        try:
            self._load(parts, ckpt_dir)
        finally:
            self.echo = echo

    def _save(self, parts: Components, ckpt_dir: Path, pos: Position) -> None:
        # rows streamed in chunks; on several processes every rank writes its own (a collective);
        # on a mesh of groups one replica (synced first): group 0's ranks
        writers = self.job.checkpoint_writers()
        if writers is not None:
            tensors, skeleton = snapshot_state(parts)
            meta = {"position": vars(pos).copy(), "state": skeleton, "config": to_dict(self.cfg), "saved_at": time.time(),
                    **self._passes_meta(), **self.job.checkpoint_meta()}  # fmt: skip
            save_checkpoint(ckpt_dir, pos.step, tensors, meta, rows=row_chunks(parts), ctx=writers)
        self.job.checkpoint_written()

    def _save_full(self, parts: Components, ckpt_dir: Path, pos: Position) -> None:
        """A full checkpoint of the run (not checkpoints/best): the base of the deltas that follow."""
        self._save(parts, ckpt_dir, pos)
        self._saved_at = dict(vars(pos))
        if self.cfg.train.delta_every:
            mark_changes(parts)
            self._published = (pos.step, pos.step)

    def _save_delta(self, parts: Components, ckpt_dir: Path, pos: Position) -> None:
        """A delta checkpoint: the rows changed since the last publication (a full one when there is none yet)."""
        if self._published is None:
            self._save_full(parts, ckpt_dir, pos)
            return
        base, previous = self._published
        tensors, skeleton, rows = delta_state(parts)  # several processes: each rank's own changed rows
        meta = {"position": vars(pos).copy(), "state": skeleton, "config": to_dict(self.cfg), "saved_at": time.time(),
                **self._passes_meta(), **self.job.checkpoint_meta()}  # fmt: skip
        save_delta(ckpt_dir, pos.step, base, previous, tensors, meta, rows=rows, ctx=self.job.ctx)
        mark_changes(parts)
        self._published = (base, pos.step)

    def _restore_with_deltas(self, parts: Components, ckpt: Path) -> dict:
        """A full checkpoint, then its chain of deltas (stopping at the first missing or damaged one)."""
        ctx = self.job.shard_ctx
        meta = apply_deltas(ckpt, self._restore_from(parts, ckpt), lambda d: restore_delta(parts, d, ctx.rank, ctx.world_size),
                            self.echo)
        self._published = (int(ckpt.name.split("_")[-1]), int(meta["step"])) if ckpt.name.startswith("step_") else None
        return meta

    def _restore_from(self, parts: Components, ckpt: Path) -> dict:
        """Restore a checkpoint of any world size; each process keeps the rows it owns."""
        ctx = self.job.shard_ctx  # on a mesh: the rank's group (each replica loads every row)
        if is_sharded(ckpt):  # the previous sharded format: every rank reads every shard
            return restore_sharded(ckpt, ctx, lambda t, sk: restore_state(parts, t, sk), lambda t: load_shard_rows(parts, t))
        with Checkpoint(ckpt) as loaded:  # saved on any number of processes; rows read a chunk at a time
            restore_checkpoint(parts, loaded, ctx.rank, ctx.world_size)
            return loaded.meta

    def _load(self, parts: Components, ckpt_dir: Path) -> tuple[Position, dict]:
        """The state of the newest intact checkpoint in ``ckpt_dir`` (and its deltas); its position and meta."""
        if not checkpoint_dirs(ckpt_dir):
            self.echo(f"no checkpoint in {ckpt_dir}; starting from scratch")
            return Position(), {}
        meta = load_newest_intact(ckpt_dir, lambda ckpt: self._restore_with_deltas(parts, ckpt), self.echo)
        self.job.resumed_at(int(meta["position"]["step"]))
        pos = Position(**meta["position"])
        self.echo(f"resumed from step {pos.step} (epoch {pos.epoch}, batch {pos.batch_in_epoch}) on {self.job.ctx.world_size} process(es)")
        return pos, meta
