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
>>> from tierec.prune import Pruner, pruned_group_factory
>>> cfg = PruneConfig(enabled=True, chunk=4, target_ratio=2.0)
>>> coll = EmbeddingCollection([TableConfig(name="t", dim=8, features=["f"])], ["f"],
...                            group_factory=pruned_group_factory(cfg))
>>> pruner = Pruner(coll, cfg)
>>> pruner.due(100), pruner.due(150)
(True, False)
>>> pruner.stats()["dim_hist"], pruner.stats()["target_bytes"]   # no rows yet
({}, 0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol
import numpy as np
import torch

from tierec.config import ConfigError, PruneConfig
from tierec.embedding import EmbeddingCollection, TableConfig
from tierec.embedding.storage import StorageFactory
from tierec.prune.group import PrunedGroup


def pruned_group_factory(cfg: PruneConfig) -> StorageFactory:
    """An EmbeddingCollection ``group_factory`` that stores every group as chunks."""

    def make(tables: list[TableConfig], seed: int, device: torch.device | str) -> PrunedGroup:
        check_chunk_dim(tables, cfg)
        return PrunedGroup(tables, cfg, seed=seed, device=device)

    return make


def check_chunk_dim(tables: list[TableConfig], cfg: PruneConfig) -> None:
    dim = tables[0].dim
    if dim % cfg.chunk:
        names = [t.name for t in tables]
        raise ConfigError(f"tables {names} have dim {dim}, not a multiple of prune.chunk={cfg.chunk}")


@dataclass(frozen=True)
class PruneStep:
    """What one pruning step did."""

    threshold: float  # importance of the least important chunk kept
    pruned: int  # chunks freed
    regrown: int  # chunks grown back
    value_bytes: int  # bytes allocated afterwards by the pools and per-row optimizer state
    target_bytes: int


class JobReduce(Protocol):
    """How the processes of a job combine what the pruner needs (one process: nothing to combine)."""

    rank: int

    def sum(self, values: np.ndarray) -> np.ndarray:  # elementwise sum over the job's processes
        ...

    def gather(self, values: np.ndarray) -> np.ndarray:  # every process's rows, concatenated in rank order
        ...


class OneProcess:
    rank = 0

    def sum(self, values: np.ndarray) -> np.ndarray:
        return values

    def gather(self, values: np.ndarray) -> np.ndarray:
        return values


class Pruner:
    def __init__(self, collection: EmbeddingCollection, cfg: PruneConfig, job: JobReduce | None = None) -> None:
        """``job``: with several processes each holding a shard of the rows, the budget, the
        threshold and the table means of the shrinkage are job-wide (see :meth:`step`)."""
        self.collection = collection
        self.groups = [p for p in (g.pruning() for g in collection.groups) if p is not None]
        self.cfg = cfg
        self.job: JobReduce = job or OneProcess()
        self.compactions = 0
        self.last: PruneStep | None = None

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

        Each process scores its own rows (with job-wide table means); the scores and tie
        keys of every process are gathered, so every process picks the same threshold
        and ties as one process would over all rows, and applies it to its own rows.
        """
        cfg, job = self.cfg, self.job
        target = self.target_bytes()
        # per-row state is paid by every row kept; with eviction only rows keeping a chunk are kept
        evict = cfg.evict_empty_rows
        pool_target = target if evict else target - self._total(sum(g.row_state_bytes() for g in self.groups))
        row_bytes = [g.row_bytes() if evict else 0 for g in self.groups]
        # 1. keep-scores of every chunk position, per group
        scores = [g.keep_scores(cfg.min_dim // cfg.chunk, cfg.regrow, cfg.regrow_margin, job.sum) for g in self.groups]
        # 2. the most important positions that fit, across all groups and processes
        sizes = [g.chunk_bytes() for g in self.groups]
        mine = [job.gather(np.array([s.shape[0]], dtype=np.int64)) for s in scores]  # rows of each process
        every = [job.gather(s) for s in scores]
        keys = [job.gather(g.tie_keys()) for g in self.groups]
        all_counts, tau = select(every, sizes, pool_target, keys, row_bytes)
        lo = [int(m[: job.rank].sum()) for m in mine]
        counts = [c[a : a + s.shape[0]] for c, a, s in zip(all_counts, lo, scores)]
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
        self.last = PruneStep(
            threshold=tau, pruned=pruned, regrown=regrown, value_bytes=self.allocated_value_bytes(), target_bytes=target
        )
        return self.last

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


def select(
    scores: list[np.ndarray],
    chunk_bytes: list[int],
    budget: int,
    tie_keys: list[np.ndarray] | None = None,
    row_bytes: list[int] | None = None,
) -> tuple[list[np.ndarray], float]:
    """Chunks to keep per row ``[n_rows]`` for each group, and the threshold.

    Keeps the highest-scoring positions (``scores[g]`` is ``[n_rows, K]``, non-increasing
    along each row, -inf = may not be kept, +inf = must be kept) whose bytes fit in
    ``budget``; a position costs ``chunk_bytes[g]``, and a row's first one also
    ``row_bytes[g]`` (per-row state that goes when a row keeps nothing). Positions tied
    at the threshold are filled in the order of ``tie_keys[g]`` ([n_rows], a hash of
    each row's id, so decisions do not depend on row numbering; default: row order),
    so the budget is used up. Each row keeps a prefix.
    """
    n_groups = len(scores)
    if tie_keys is None:
        tie_keys = [np.arange(s.shape[0], dtype=np.uint64) for s in scores]
    row_bytes = row_bytes or [0] * n_groups
    cand = [s > -np.inf for s in scores]
    need = sum(int(c.sum()) * b + int(c[:, 0].sum()) * rb for c, b, rb in zip(cand, chunk_bytes, row_bytes))
    if need <= budget:
        return [c.sum(axis=1) for c in cand], -np.inf
    if len(set(zip(chunk_bytes, row_bytes))) > 1:
        return _select_sorted(scores, chunk_bytes, budget, tie_keys, row_bytes)
    b, rb = chunk_bytes[0], row_bytes[0]
    values = np.sort(np.concatenate([s[c] for s, c in zip(scores, cand)]))  # ascending
    firsts = np.sort(np.concatenate([s[:, 0][c[:, 0]] for s, c in zip(scores, cand)]))

    def cost(v: float) -> int:  # bytes of every position scoring >= v
        n_all = values.size - np.searchsorted(values, v, "left")
        n_first = firsts.size - np.searchsorted(firsts, v, "left")
        return int(n_all) * b + int(n_first) * rb

    lo, hi = 0, values.size  # the smallest index whose value's positions all fit
    while lo < hi:
        mid = (lo + hi) // 2
        if cost(values[mid]) <= budget:
            hi = mid
        else:
            lo = mid + 1
    tau = float(values[lo]) if lo < values.size else np.inf
    counts = [(s >= tau).sum(axis=1) for s in scores]
    spare = budget - cost(tau)
    if lo == 0 or spare <= 0:
        return counts, tau
    # the next lower value does not fit whole: take its tied positions, rows in tie-key order
    t2 = values[lo - 1]
    parts = []  # per group: (group, row, tied positions, opens the row, tie key) of rows with ties
    for g, s in enumerate(scores):
        t = (s == t2).sum(axis=1)
        r = np.flatnonzero(t)
        parts.append((np.full(r.size, g), r, t[r], (counts[g][r] == 0).astype(np.int64), tie_keys[g][r]))
    g_of, r_of, n_tied, opens, keys = (np.concatenate(x) for x in zip(*parts))
    order = np.argsort(keys, kind="stable")
    g_of, r_of, n_tied, opens = g_of[order], r_of[order], n_tied[order], opens[order]
    whole = n_tied * b + opens * rb  # a row keeping nothing so far also pays its row bytes
    fits = np.cumsum(whole) <= spare
    n_whole = int(fits.sum())  # rows taken whole, then at most one part
    take = np.where(fits, n_tied, 0)
    if n_whole < take.size:
        left = spare - int(whole[:n_whole].sum()) - int(opens[n_whole]) * rb
        take[n_whole] = min(max(left // b, 0), n_tied[n_whole])
    for g in range(n_groups):
        sel = g_of == g
        np.add.at(counts[g], r_of[sel], take[sel])
    return counts, tau


def _select_sorted(
    scores: list[np.ndarray], chunk_bytes: list[int], budget: int, tie_keys: list[np.ndarray], row_bytes: list[int]
) -> tuple[list[np.ndarray], float]:
    """Positions of unequal cost: greedy over one sort by (score desc, tie key, position)."""
    flat = np.concatenate([s.ravel() for s in scores])
    cost = []
    for s, b, rb in zip(scores, chunk_bytes, row_bytes):
        c = np.full(s.shape, b, dtype=np.int64)
        c[:, 0] += rb
        cost.append(c.ravel())
    sizes = np.concatenate(cost)
    keys = np.concatenate([np.repeat(t, s.shape[1]) for s, t in zip(scores, tie_keys)])
    pos = np.concatenate([np.tile(np.arange(s.shape[1]), s.shape[0]) for s in scores])
    order = np.lexsort((pos, keys, -flat))
    v = flat[order]
    keep_sorted = ((np.cumsum(sizes[order]) <= budget) | (v == np.inf)) & (v > -np.inf)
    keep = np.zeros(flat.size, dtype=bool)
    keep[order[keep_sorted]] = True
    out, start = [], 0
    for s in scores:
        out.append(keep[start : start + s.size].reshape(s.shape).sum(axis=1))
        start += s.size
    kept = v[keep_sorted]
    return out, float(kept.min()) if kept.size else np.inf
