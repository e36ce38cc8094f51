"""TrainPipeline: the one place that decides what runs ahead of the training step, on which thread, how far.

For batch ``t`` the stages are:

1. **load and decode**: the loader thread (``data.prefetch_batches`` ahead); for a
   GPU model it also pins each batch's dense features and labels;
2. **dedupe and index probe** of batch ``t + 1`` (plain storage with
   ``train.look_ahead``): a thread of its own, started once batch ``t``'s
   embedding forward has inserted its ids (:class:`~tierec.embedding.ahead.LookAhead`);
3. **read ahead** the disk rows of the next window of ``k = store.prefetch_depth``
   batches on the disk tier's read-ahead threads (tiered storage with
   ``store.prefetch``: :class:`~tierec.store.pipeline.StorePipeline`, which also shows the
   stores the ids of the next ``store.horizon`` batches for their eviction), and **bring
   up** batch ``t + 1``'s rows (its whole lookup in the tiers: from host and disk,
   with the evictions and write-backs it needs; its dedupe and probe are the
   window's, done once for the window's batches) on stage 2's thread during batch
   ``t``'s step (one process, ``store.lookup_ahead``; where the loop leaves the
   store a core, from before batch ``t``'s embedding forward if batch ``t``'s own
   lookup ran ahead: the forward then only reads its pinned rows), except where the caller
   says the tables are used between the two steps (``run``'s ``quiet``: a
   checkpoint, an evaluation, the end); or send batch ``t + 1``'s ids to their
   owner ranks (several processes with ``dist.overlap``: each sharded
   collection's ``prepare``, whose handles the pipeline keeps and hands to batch
   ``t + 1``'s forward);
4. **forward, backward and fused update** of batch ``t`` on the caller's thread
   (:meth:`TrainPipeline.step`);
5. **write-back and eviction**: inside the tiers, whenever stage 3 or 4 needs a slot.

Where a lookup runs ahead in tiers with compact cold rows (``store.cold_precision``
int8 or bf16) or with a horizon (``store.horizon``; with fp32 rows and none too where
``store.leave_core`` is on) and ``train.threads`` is 0, the loop leaves the store a
core: torch and numba run on one thread fewer than the process's (:meth:`threads`;
in every step, as the dense step's rounding depends on the count), and the store's
stage 3 runs on a thread of its own beside the lookup
(``StorePipeline.run(thread=True)``) instead of on the step's thread between
steps. On 2 cores that ran at 1.15-1.3x the samples/s of the dense step on both
cores with the tiers' threads squeezed beside it (docs/performance.md, "Tables
beyond memory"), with fp32 rows and a horizon at 1.2-1.45x (4x and 16x). With fp32
rows and no horizon it lost on the 21M-id stream (both halves, reads by native AIO),
and the tiered run would no longer give the numbers of the same run in memory, so
there (``store.leave_core = "auto"``) the step keeps every thread, as it does with
an explicit ``train.threads``; only its row update leaves the lookup a numba thread.

No stage changes a number: each only moves work earlier, and the step is the
sequential step (tests/train/test_pipeline.py, tests/embedding/test_ahead.py,
tests/store/, tests/distributed/). The trainer calls :meth:`run` once per
epoch; benchmarks call :meth:`step` on batches they hold.

>>> import tempfile
>>> from tierec.config import load_config
>>> from tierec.data import open_source
>>> from tierec.distributed.job import Job
>>> from tierec.train.components import Components
>>> from tierec.train.pipeline import TrainPipeline
>>> cfg = load_config(None, ["data.synthetic.train_rows=2048", "train.batch_size=1024", "embedding.dim=4"])
>>> source = open_source(cfg.data, "train", 1024)
>>> job = Job(cfg)
>>> parts = Components.build(cfg, source.feature_names, source.n_dense)
>>> with TrainPipeline(parts, job, cfg) as pipe:
...     [s.batch.size for s in pipe.run(source)]
[1024, 1024]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numba
import torch
import torch.nn.functional as F

from tierec.batch import Batch, with_next
from tierec.config import Config
from tierec.data import BackgroundLoader
from tierec.device import is_host
from tierec.embedding.ahead import LookAhead
from tierec.store.monitor import StoreMonitor
from tierec.threads import use_threads
from tierec.train.components import Components, PreparedBatch


@dataclass(frozen=True)
class Step:
    """One training step done: the global batch, its mean loss, and the seconds the step took (stage 4,
    with whatever it waited for the stages ahead of it; not the wait for the loader)."""

    batch: Batch
    loss: float
    seconds: float


class TrainPipeline:
    def __init__(self, parts: Components, job: Any, cfg: Config, store: StoreMonitor | None = None) -> None:
        """``job``: the processes the step runs on (:class:`tierec.distributed.job.Job`); ``store``: the
        tiered stores' monitor, whose prefetch stage is stage 3 (built from ``cfg.store`` when not given)."""
        self.parts = parts
        self.job = job
        self.cfg = cfg
        self.store = store if store is not None else StoreMonitor.for_components(parts, cfg.store)
        # stage 2: plain storage only (the sharded collection's stage 3 sends the ids, which the probe would
        # race); stage 3 in the tiers of one process: the next batch's lookup, on the same thread
        probe = cfg.train.look_ahead and not job.distributed and not cfg.store.enabled
        bring_up = cfg.store.lookup_ahead and not job.distributed and any(
            getattr(g, "lookup_ahead", None) is not None for g in parts.embeddings.groups
        )
        self.ahead = LookAhead(parts.embeddings, probe=probe, bring_up=bring_up) if probe or bring_up else None
        # with compact cold rows or a horizon (store.leave_core auto) the lookup run ahead in the tiers gets a core
        # of its own: the training loop runs on one torch (and numba) thread fewer, in every step (the dense step's
        # rounding depends on the count), unless train.threads says how many. Otherwise fp32 cold rows keep every
        # thread unless store.leave_core is on: the tiered run then gives the numbers of the same run in memory.
        # None: the process's
        n = torch.get_num_threads()
        leave = {"on": True, "off": False, "auto": self.store.lossy or self.store.horizon > 0}[cfg.store.leave_core]
        leave_core = bring_up and leave and not cfg.train.threads
        self.step_threads = n - 1 if leave_core and n > 1 else None
        self._quiet: Callable[[], bool] | None = None  # run()'s: may the tables move on to the next batch now?
        # stage 3 on several processes: the next batch's ids go out while this batch computes (in a job every
        # embedding collection is sharded: parallelize); the exchanges no step used are waited out in close()
        self.exchange = [c for c in (parts.embeddings, parts.wide) if c is not None] \
            if job.distributed and cfg.dist.overlap else []
        # (global batch, this rank's slice, what its collections prepared): the next batch, its ids sent ahead
        self._next: tuple[Batch, Batch, PreparedBatch] | None = None

    # ------------------------------------------------------------ the stream

    def run(self, source: Iterable[Batch], quiet: Callable[[], bool] | None = None) -> Iterator[Step]:
        """One pass over ``source``: each batch trained, in order (stages 1-5).

        ``quiet``: asked during a step, before the next batch's lookup runs ahead in the tiers: False when the
        caller will use the tables between this step and the next (save, evaluate, stop); None: never."""
        cfg = self.cfg
        self._quiet = quiet
        pin = not is_host(cfg.train.device)
        with self.threads(), BackgroundLoader(source, depth=cfg.data.prefetch_batches, pin=pin) as loader:
            # stage 3 of the tiers (on a thread of its own where the step leaves the store a core); the look-ahead
            # after it: same order on every rank
            stream = self.store.wrap(loader, thread=self.step_threads is not None)
            try:
                for batch, nxt in with_next(stream):  # the next batch is pulled before this one trains
                    t0 = time.perf_counter()
                    loss = self.step(batch, nxt)
                    yield Step(batch, loss, time.perf_counter() - t0)
            finally:
                self.store.close()  # the store's stage stops before the loader under it is closed

    # ------------------------------------------------------------ stage 4

    def step(self, batch: Batch, nxt: Batch | None = None) -> float:
        """Forward, backward and update of the global ``batch``; starts stages 2 and 3 for ``nxt`` (the batch
        after it, or None). Returns the global batch's mean loss."""
        with self.threads():
            return self._step(batch, nxt)

    @contextmanager
    def threads(self) -> Iterator[None]:
        """Inside: torch's and numba's threads are the training loop's (``step_threads``: one fewer than the
        process's where a lookup runs ahead in the tiers, ``store.leave_core`` leaves them a core and
        ``train.threads`` is 0); the counts before come back after."""
        if self.step_threads is None or torch.get_num_threads() == self.step_threads:
            yield
            return
        torch_before, numba_before = torch.get_num_threads(), numba.get_num_threads()
        use_threads(self.step_threads)
        try:
            yield
        finally:
            torch.set_num_threads(torch_before)
            numba.set_num_threads(numba_before)

    def _step(self, batch: Batch, nxt: Batch | None) -> float:
        parts, job = self.parts, self.job
        parts.train(True)
        local, prepared = self._local(batch)  # this process's slice on the model's device, and its exchanges
        if nxt is not None and self.exchange:  # stage 3: the next batch's ids go to their owners now
            upcoming = job.local(nxt)
            self._next = (nxt, upcoming, parts.prepare(upcoming))
        move_on: bool | None = None  # _may_move_on(), asked once
        submitted = False
        if self.ahead is not None:  # stage 2 (one process): this batch's dedupe and probe, or its lookup
            got = self.ahead.take(local.sparse)
            prepared = PreparedBatch(embeddings=got)
            # stage 3 in the tiers, where the loop leaves it a core: if this batch's lookup is done in every tiered
            # group, its forward looks nothing up there (it reads pinned rows), so the next batch's lookup starts
            # before it (4x fp32, horizon 128: 0.43-0.45x of in memory against 0.42-0.44x, three paired runs;
            # on the step's cores it would take them from the forward's threads)
            if self.ahead.bring_up and self.step_threads is not None and got is not None and nxt is not None \
                    and parts.embeddings.brought_up(got):
                move_on = submitted = self._may_move_on()
                if submitted:
                    self.ahead.submit(nxt.sparse)
        emb, wide = parts.embed(local, prepared)
        narrowed: int | None = None  # numba threads to give back after the step
        if self.ahead is not None and nxt is not None and (self._may_move_on() if move_on is None else move_on):
            if not submitted:  # stages 2 and 3: this batch's ids are in; probe (bring up) the next one's
                self.ahead.submit(nxt.sparse)
            if self.ahead.bring_up and numba.get_num_threads() > 1:  # the step's row update leaves the lookup a core
                narrowed = numba.get_num_threads()
                numba.set_num_threads(narrowed - 1)
        try:
            logits = parts.dense(local, emb, wide)
            loss_sum = F.binary_cross_entropy_with_logits(logits, local.labels, reduction="sum")
            parts.optimizer.zero_grad(set_to_none=True)
            # x W / B: DDP's mean over ranks and the owners' summed row gradients are the global batch mean's
            (loss_sum * job.loss_scale(batch)).backward()  # embedding rows are updated here, by their fused optimizers
            parts.optimizer.step()
        finally:
            if narrowed is not None:
                numba.set_num_threads(narrowed)
        job.after_step()  # on a mesh: the cross-group averaging that is due
        return job.mean_loss(loss_sum, batch)

    def _may_move_on(self) -> bool:
        """May the next batch's lookup change the tables before this step ends?"""
        return not self.ahead.bring_up or self._quiet is None or self._quiet()

    def describe(self) -> str:
        """One line on the lookup run ahead in the tiers, or "" when there is none."""
        if self.ahead is None or not self.ahead.bring_up:
            return ""
        line = "store: each next batch's lookup in the tiers runs during the step (store.lookup_ahead)"
        if self.step_threads is not None:
            line += (f", which leaves it and the read-ahead stage a core: the step runs on {self.step_threads} "
                     f"thread(s) (train.threads = 0; set it to give the step more)")
        return line

    @property
    def ahead_pending(self) -> bool:
        """The next batch was looked up ahead in the tiers: it must be trained before the tables are used."""
        return self.ahead is not None and self.ahead.bring_up and self.ahead.pending

    def _local(self, batch: Batch) -> tuple[Batch, PreparedBatch | None]:
        """This process's slice of ``batch``, and what was prepared for it when it was the step's ``nxt``
        (an exchange prepared for another batch is left to the collections: waited out by a later one, or at close)."""
        job = self.job
        job.count_step()  # (a fault test's planned crash happens here)
        ahead, self._next = self._next, None
        if ahead is not None and ahead[0] is batch:
            return ahead[1], ahead[2]
        return job.local(batch), None

    # ------------------------------------------------------------ lifetime

    def stop(self) -> None:
        """Stop this process's threads (the store's stage, the look-ahead); no collective, so it is safe
        whatever the other ranks are doing (a run that ended on an error)."""
        self.store.close()
        if self.ahead is not None:
            self.ahead.close()

    def close(self) -> None:
        """Stop the stages still running (a loop that broke out early), and wait out id exchanges that no
        step will use (every rank calls it at the same point)."""
        self.stop()
        self._next = None
        for coll in self.exchange:
            coll.close()

    def __enter__(self) -> TrainPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
