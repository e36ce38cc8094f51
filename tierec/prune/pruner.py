"""Pruner: every N steps, one importance threshold for all pruned groups, set to meet the budget.

A pruning step (1) scores every chunk position of every row: a live chunk
scores the largest importance at or after it in its row (a row keeps a
prefix, so a chunk stays while any later one does); the first pruned position
scores the row's claim to grow back divided by ``regrow_margin``; (2) picks the
threshold that keeps the most important positions within the byte budget
(``memory_budget``, or the unpruned pool bytes over ``target_ratio``); (3)
frees the trailing chunks under it and grows back claimed ones, one chunk per
row per step; (4) decays every importance; (5) compacts pools that are mostly
free or over the budget, so the bytes really fall.

>>> from tierec.config import PruneConfig
>>> from tierec.embedding import EmbeddingCollection, TableConfig
>>> from tierec.prune import Pruner, pruned_group_factory
>>> cfg = PruneConfig(enabled=True, chunk=4, target_ratio=2.0)
>>> coll = EmbeddingCollection([TableConfig(name="t", dim=8, features=["f"])], ["f"],
...                            group_factory=pruned_group_factory(cfg))
>>> pruner = Pruner(coll, cfg)
>>> pruner.due(100), pruner.due(150)
(True, False)
>>> sorted(pruner.stats())[:3]
['compactions', 'dim_hist', 'embedding_bytes']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from tierec.config import ConfigError, PruneConfig
from tierec.embedding import EmbeddingCollection, TableConfig, TableGroup
from tierec.prune.group import PrunedGroup


def pruned_group_factory(cfg: PruneConfig) -> Callable[[list[TableConfig], int, torch.device | str], TableGroup]:
    """An EmbeddingCollection ``group_factory`` that stores every group as chunks."""

    def make(tables: list[TableConfig], seed: int, device: torch.device | str) -> TableGroup:
        dim = tables[0].dim
        if dim % cfg.chunk:
            names = [t.name for t in tables]
            raise ConfigError(f"tables {names} have dim {dim}, not a multiple of prune.chunk={cfg.chunk}")
        return PrunedGroup(tables, cfg, seed=seed, device=device)

    return make


@dataclass(frozen=True)
class PruneStep:
    """What one pruning step did."""

    threshold: float
    pruned: int  # chunks freed
    regrown: int  # chunks grown back
    pool_bytes: int  # bytes allocated by the pools afterwards
    target_bytes: int


class Pruner:
    def __init__(self, collection: EmbeddingCollection, cfg: PruneConfig) -> None:
        self.collection = collection
        self.groups = [g for g in collection.groups if isinstance(g, PrunedGroup)]
        self.cfg = cfg
        self.compactions = 0
        self.last: PruneStep | None = None

    def due(self, step: int) -> bool:
        """True when global step ``step`` (1-based, after its update) is a pruning step."""
        c = self.cfg
        return bool(self.groups) and step >= max(c.start_step, 1) and step % c.every == 0

    def target_bytes(self) -> int:  # bytes the pools may keep
        if self.cfg.memory_budget:
            return self.cfg.memory_budget
        return int(sum(g.full_pool_bytes() for g in self.groups) / self.cfg.target_ratio)

    # --------------------------------------------------------------- the step

    def step(self) -> PruneStep:
        cfg = self.cfg
        target = self.target_bytes()
        # 1. keep-scores of every chunk position, per group
        scores = [g.keep_scores(cfg.min_dim // cfg.chunk, cfg.regrow, cfg.regrow_margin) for g in self.groups]
        # 2. one threshold for all groups
        tau = _threshold(scores, [g.chunks.bytes_per_chunk() for g in self.groups], target)
        pruned = regrown = 0
        for g, s in zip(self.groups, scores):
            counts = (s > -np.inf).sum(axis=1) if tau == -np.inf else (s >= tau).sum(axis=1)
            # 3. free trailing chunks under the threshold, grow back claimed ones
            p, r = g.apply_counts(counts.astype(np.int64))
            pruned, regrown = pruned + p, regrown + r
            # 4. decay
            g.decay_importance(cfg.decay)
        # 5. compact pools that are mostly free, or all of them while over the budget
        over = sum(g.pool_bytes() for g in self.groups) > target
        for g in self.groups:
            pool = g.chunks
            if pool.num_free and (over or pool.num_free >= cfg.compact_free_fraction * pool.capacity):
                g.compact()
                self.compactions += 1
        pool_bytes = sum(g.pool_bytes() for g in self.groups)
        self.last = PruneStep(threshold=float(tau), pruned=pruned, regrown=regrown, pool_bytes=pool_bytes, target_bytes=target)
        return self.last

    # --------------------------------------------------------------- reports

    def counts(self) -> tuple[int, int]:  # chunks pruned, regrown since the start (cheap)
        return int(sum(g.pruned.sum() for g in self.groups)), int(sum(g.regrown.sum() for g in self.groups))

    def stats(self) -> dict:
        """Allocated bytes, the histogram of row dims, pruned / regrown chunk counts (since the start)."""
        hist: dict[int, int] = {}
        for g in self.groups:
            for k, n in enumerate(g.dim_histogram()):
                if n:
                    hist[k * g.chunk] = hist.get(k * g.chunk, 0) + int(n)
        return {
            "embedding_bytes": self.collection.nbytes(),
            "pool_bytes": sum(g.pool_bytes() for g in self.groups),
            "full_pool_bytes": sum(g.full_pool_bytes() for g in self.groups),
            "target_bytes": self.target_bytes(),
            "dim_hist": dict(sorted(hist.items())),
            "pruned_chunks": self.counts()[0],
            "regrown_chunks": self.counts()[1],
            "compactions": self.compactions,
        }


def _threshold(scores: list[np.ndarray], chunk_bytes: list[int], target: int) -> float:
    """The smallest threshold whose kept positions (score >= it) fit in ``target`` bytes.

    -inf when every position that may be kept fits.
    """
    flat = [s.ravel() for s in scores]
    flat = [f[f > -np.inf] for f in flat]
    total = sum(f.size * b for f, b in zip(flat, chunk_bytes))
    if total <= target:
        return -np.inf
    if len(set(chunk_bytes)) == 1:
        allv = np.concatenate(flat) if len(flat) > 1 else flat[0]
        k = target // chunk_bytes[0]  # positions that fit
        if k <= 0:
            return np.inf
        tau = np.partition(allv, allv.size - k)[allv.size - k]  # the k-th largest
        if (allv >= tau).sum() > k:  # ties: keep fewer rather than exceed
            tau = np.nextafter(tau, np.float32(np.inf))
        return float(tau)
    values = np.concatenate(flat)
    sizes = np.concatenate([np.full(f.size, b, dtype=np.int64) for f, b in zip(flat, chunk_bytes)])
    order = np.argsort(-values, kind="stable")
    fits = np.cumsum(sizes[order]) <= target
    k = int(fits.sum())
    if k == 0:
        return np.inf
    tau = values[order[k - 1]]
    if k < values.size and values[order[k]] == tau:
        tau = np.nextafter(tau, np.float32(np.inf))
    return float(tau)
