"""Pruner: every N steps, one importance threshold for all pruned groups, set to meet the budget.

A pruning step (1) scores every chunk position of every row: a live chunk
scores the largest importance at or after it in its row (a row keeps a
prefix, so a chunk stays while any later one does); the first pruned position
scores the row's claim to grow back divided by ``regrow_margin``; (2) picks the
threshold that keeps the most important positions within the byte budget
(``memory_budget``, or the unpruned pool bytes over ``target_ratio``); (3)
frees the trailing chunks under it and grows back claimed ones, one chunk per
row per step; (4) decays every importance and forgets rows left with no chunk
(``evict_empty_rows``); (5) compacts pools that are mostly free or over the
budget, so the bytes really fall.

>>> from tierec.config import PruneConfig
>>> from tierec.embedding import EmbeddingCollection, TableConfig
>>> from tierec.prune import Pruner
>>> from tierec.storage import storage_factory
>>> cfg = PruneConfig(enabled=True, chunk=4, target_ratio=2.0)
>>> coll = EmbeddingCollection([TableConfig(name="t", dim=8, features=["f"])], ["f"],
...                            group_factory=storage_factory(prune=cfg))
>>> pruner = Pruner(coll, cfg)
>>> pruner.due(100), pruner.due(150)
(True, False)
>>> pruner.stats()["dim_hist"], pruner.stats()["target_bytes"]   # no rows yet
({}, 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tierec.config import ConfigError, PruneConfig
from tierec.embedding import EmbeddingCollection, TableConfig
from tierec.prune.select import JobReduce, OneProcess, Positions, select_spread


def check_chunk_dim(tables: list[TableConfig], cfg: PruneConfig) -> None:
    dim = tables[0].dim
    if dim % cfg.chunk:
        names = [t.name for t in tables]
        raise ConfigError(f"tables {names} have dim {dim}, not a multiple of prune.chunk={cfg.chunk}")


class Replicated(Protocol):
    """A collection whose rows may also live elsewhere (hot-row replicas on every rank of a job)."""

    def rows_at_owners(self) -> AbstractContextManager[None]:
        """Within: the storages the pruner works on hold every row's current values and importance;
        on leaving, the other copies take the step's decision (a collective)."""
        ...


@dataclass(frozen=True)
class PruneStep:
    """What one pruning step did."""

    threshold: float  # importance of the least important chunk kept
    pruned: int  # chunks freed
    regrown: int  # chunks grown back
    value_bytes: int  # bytes allocated afterwards by the pools and per-row optimizer state
    target_bytes: int


class Pruner:
    def __init__(self, collection: EmbeddingCollection, cfg: PruneConfig, job: JobReduce | None = None,
                 replicated: Sequence[Replicated] = ()) -> None:
        """``job``: with several processes each holding a shard of the rows, the budget, the
        threshold and the table means of the shrinkage are job-wide (see :meth:`step`).
        ``replicated``: what else holds rows of ``collection`` (the sharded collection over it, whose
        hot rows are replicated on every rank): each step runs within their ``rows_at_owners()``."""
        self.collection = collection
        self.groups = [p for p in (g.pruning() for g in collection.groups) if p is not None]
        self.cfg = cfg
        self.job: JobReduce = job or OneProcess()
        self.replicated = tuple(replicated)
        self.compactions = 0
        self.last: PruneStep | None = None

    def for_job(self, job: JobReduce, replicated: Sequence[Replicated] = ()) -> Pruner:
        """A pruner of the same collection and config whose steps are collectives of ``job``."""
        return Pruner(self.collection, self.cfg, job, replicated)

    def _total(self, value: float) -> int:  # an integer summed over the job
        return int(self.job.sum(np.array([value], dtype=np.int64))[0])

    def due(self, step: int) -> bool:
        """True when global step ``step`` (1-based, after its update) is a pruning step."""
        c = self.cfg
        return bool(self.groups) and step >= max(c.start_step, 1) and step % c.every == 0

    def target_bytes(self) -> int:
        """Value bytes allowed: ``memory_budget``, or the unpruned tables' bytes over ``target_ratio``."""
        if self.cfg.memory_budget:
            return self.cfg.memory_budget
        return int(self._total(sum(g.full_value_bytes() for g in self.groups)) / self.cfg.target_ratio)

    def allocated_value_bytes(self) -> int:  # what the target limits: pools as allocated, per-row state (job-wide)
        return self._total(sum(g.pool_bytes() + g.row_state_bytes() for g in self.groups))

    # --------------------------------------------------------------- the step

    def step(self) -> PruneStep:
        """One pruning step; with several processes a collective, the same choice as one process.

        Each process scores its own rows (with job-wide table means); one radix descent over
        all-reduced histograms (:func:`tierec.prune.select.select_spread`) finds the positions
        one process would keep over all rows, and each process applies it to its own rows.
        Replicated rows are brought to their owners first and take the decision after.
        """
        with ExitStack() as stack:
            for r in self.replicated:
                stack.enter_context(r.rows_at_owners())
            self.last = self._step()
        return self.last

    def _step(self) -> PruneStep:
        cfg, job = self.cfg, self.job
        target = self.target_bytes()
        # per-row state is paid by every row kept; with eviction only rows keeping a chunk are kept
        evict = cfg.evict_empty_rows
        pool_target = target if evict else target - self._total(sum(g.row_state_bytes() for g in self.groups))
        row_bytes = [g.row_bytes() if evict else 0 for g in self.groups]
        # 1. keep-scores of every chunk position, per group
        scores = [g.keep_scores(cfg.min_dim // cfg.chunk, cfg.regrow, cfg.regrow_margin, job.sum) for g in self.groups]
        # 2. the most important positions that fit, across all groups and processes (histograms, not rows, travel)
        sizes = [g.chunk_bytes() for g in self.groups]
        mine = Positions(scores, sizes, [g.tie_keys() for g in self.groups], row_bytes)
        (counts,), tau = select_spread([mine], pool_target, job)
        pruned = regrown = 0
        for g, c in zip(self.groups, counts):
            # 3. free trailing chunks under the threshold, grow back claimed ones
            p, r = g.apply_counts(c)
            pruned, regrown = pruned + p, regrown + r
            # 4. decay; forget rows left empty
            g.decay_importance(cfg.decay)
            if cfg.evict_empty_rows:
                g.evict_empty_rows()
        # 5. compact pools that are mostly free, or all of them while over the budget
        over = self.allocated_value_bytes() > target
        for g in self.groups:
            self.compactions += g.maybe_compact(over, cfg.compact_free_fraction)
        pruned, regrown = (int(x) for x in job.sum(np.array([pruned, regrown], dtype=np.int64)))
        return PruneStep(
            threshold=tau, pruned=pruned, regrown=regrown, value_bytes=self.allocated_value_bytes(), target_bytes=target
        )

    # --------------------------------------------------------------- reports

    def counts(self) -> tuple[int, int]:  # chunks pruned, regrown since the start (cheap: this process's)
        return int(sum(g.pruned.sum() for g in self.groups)), int(sum(g.regrown.sum() for g in self.groups))

    def stats(self) -> dict:
        """Bytes, the histogram of row dims, pruned / regrown chunk counts (since the start).

        ``embedding_bytes``: everything the collection holds (pools, chunk maps, index, plain
        tables); ``value_bytes``: live chunks and per-row optimizer state; ``allocated_value_bytes``:
        the same with the pools' free chunks, what ``target_bytes`` limits; ``full_value_bytes``:
        what plain tables would hold for the same rows.
        """
        hist = np.zeros(max((g.dim for g in self.groups), default=0) + 1, dtype=np.int64)  # rows per dim
        for g in self.groups:
            h = g.dim_histogram()
            hist[np.arange(h.size) * g.chunk] += h
        hist = self.job.sum(hist)
        pruned, regrown = self.counts()
        evicted = int(sum(g.evicted.sum() for g in self.groups))
        totals = self.job.sum(np.array([
            self.collection.nbytes(), sum(g.value_bytes() for g in self.groups),
            sum(g.full_value_bytes() for g in self.groups), pruned, regrown, evicted, self.compactions,
        ], dtype=np.int64))  # fmt: skip
        return {
            "embedding_bytes": int(totals[0]),
            "value_bytes": int(totals[1]),
            "allocated_value_bytes": self.allocated_value_bytes(),
            "full_value_bytes": int(totals[2]),
            "target_bytes": self.target_bytes(),
            "dim_hist": {int(d): int(n) for d, n in enumerate(hist) if n},
            "pruned_chunks": int(totals[3]),
            "regrown_chunks": int(totals[4]),
            "evicted_rows": int(totals[5]),
            "compactions": int(totals[6]),
        }
