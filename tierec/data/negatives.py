"""Sampled negatives for implicit feedback (``data.negatives = K``): K rows per positive, made as batches are read.

A log of uses, plays or purchases holds positives only. For every positive row,
:meth:`NegativeSampler.expand` adds K rows right after it: copies of the row (the
same user, the same context: time, place, device, every other column) with the
item column replaced by a sampled item and label 0; the positive gets label 1. An
item is drawn uniformly from the items of the split being read and the splits
before it, or by their counts there (``"popularity"``): training negatives from
the training items, validation and test negatives from the items of training and
that split (an item first used in the test split is a candidate there as it is a
positive there: drawn from training items alone, every test row of such an item
would be a positive, and "never seen in training" would predict the label). A
draw is redrawn while the user has the item: in the training split, or in the
split itself for validation and test negatives. The columns of
``data.item_features`` (the item's price class, its category) are the sampled
item's, from its first row in training (else in the split).

Every draw is a hash of (seed, split, epoch, the positive's row in the file, which
of its K negatives, which attempt), not a stream of random numbers, so the
negatives of a row never depend on the batch size, the shuffle, how a file is cut
into blocks or what else was read before: the test and validation negatives are
the same rows in every run with the same ``data.negative_seed`` (whatever the
model, ``train.seed`` or batch size), and training negatives are drawn afresh for
every epoch yet repeat exactly when a run resumes.

A user who has (nearly) every item is rejected many times: after :data:`ATTEMPTS`
draws the rest are drawn exactly among the items that user does not have; a user
who has every training item gets no negatives.

>>> import numpy as np
>>> from tierec.data.blocks import RowBlock
>>> from tierec.data.interactions import ColumnRoles, Interactions
>>> ids = np.array([[1, 1, 2, 2], [10, 11, 12, 13]])  # [F, n]: users, items
>>> blk = RowBlock.from_ids(np.zeros(4, np.float32), np.zeros((4, 0), np.float32), ids).with_rows(np.arange(4))
>>> roles = ColumnRoles(user=0, item=1)
>>> sampler = NegativeSampler(NegativeSpec(k=2, popularity=False, roles=roles), Interactions.scan([blk], roles), None, salt=7)
>>> out = sampler.expand(blk)
>>> out.labels.tolist()
[1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
>>> users, items = out.feature(0)[0], out.feature(1)[0]
>>> bool(np.all(~np.isin(items[:6][out.labels[:6] == 0], [10, 11])))  # never an item user 1 has
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from tierec.data.blocks import RowBlock, skip_rows
from tierec.data.errors import DataError, ProblemReport
from tierec.data.interactions import GOLDEN, ColumnRoles, Interactions, ItemPool, mix64

if TYPE_CHECKING:
    from tierec.data.splits import Rows

ATTEMPTS = 32  # draws per negative before the exact draw among the items the user does not have
_ATTEMPT = np.uint64(0xD1B54A32D192ED03)


@dataclass(frozen=True)
class NegativeSpec:
    k: int  # negatives per positive
    popularity: bool  # draw items by their training counts (else uniformly)
    roles: ColumnRoles


@dataclass(frozen=True)
class NegativeSampler:
    """Draws and adds the negatives of one split (and, for training, one epoch)."""

    spec: NegativeSpec
    train: Interactions  # what each user has in training (excluded), and the items to draw from
    held: Interactions | None  # validation / test: what each user has in that split (excluded), its items drawn from too
    salt: int  # from (data.negative_seed, split, epoch): see negative_salt

    def expand(self, block: RowBlock) -> RowBlock:
        """The block with each positive followed by its negatives; labels 1 for positives, 0 for negatives."""
        roles, k = self.spec.roles, self.spec.k
        if block.rows is None:
            raise DataError("sampled negatives need each row's place in its file (data.negatives works on files)")
        n = block.size
        labels = block.labels if roles.keep_label else np.ones(n, np.float32)  # [n]
        src = np.repeat(np.flatnonzero(labels >= 0.5), k)  # [m * k] the positive each negative copies
        users, items = block.feature(roles.user)[0], block.feature(roles.item)[0]
        which = np.tile(np.arange(k, dtype=np.int64), src.size // k)
        picked = self.draw(users[src], block.rows[src], which)  # [m * k] index into train.items, -1: none
        src, picked = src[picked >= 0], picked[picked >= 0]
        origin = np.concatenate([np.arange(n, dtype=np.int64), src])  # each row, then each negative
        order = np.argsort(origin, kind="stable")  # a row, then its negatives
        negative = order >= n
        out = block.select(origin[order])
        new_items = items[origin[order]]
        chosen = picked[order[negative] - n]  # [m'] the sampled items, in output order
        pool = self.pool
        new_items[negative] = pool.items[chosen]
        out = out.with_feature_ids(roles.item, new_items)
        for a, f in enumerate(roles.attributes):
            ids = out.feature(f)[0].copy()
            ids[negative] = pool.attributes[chosen, a]
            out = out.with_feature_ids(f, ids)
        return out.with_labels(np.where(negative, np.float32(0), labels[origin[order]]).astype(np.float32))

    def draw(self, users: np.ndarray, rows: np.ndarray, which: np.ndarray) -> np.ndarray:
        """[m] int64: for each (user, file row, which negative) an index into ``pool.items`` the user does not
        have, or -1 when there is none."""
        out = np.full(users.shape[0], -1, np.int64)
        pool = self.pool
        if pool.items.size == 0 or users.size == 0:
            return out
        with np.errstate(over="ignore"):
            base = mix64(mix64(rows.astype(np.int64).view(np.uint64) ^ np.uint64(self.salt)) + which.astype(np.uint64) * GOLDEN)
        todo = np.arange(users.shape[0])
        for attempt in range(1, ATTEMPTS + 1):
            cand = self._pick(_unit(base[todo], attempt))
            bad = self._excluded(users[todo], pool.items[cand])
            out[todo[~bad]] = cand[~bad]
            todo = todo[bad]
            if todo.size == 0:
                return out
        for user in np.unique(users[todo]):  # users with (nearly) every item: exactly, among the items they lack
            at = todo[users[todo] == user]
            allowed = np.flatnonzero(~self._excluded(np.full(pool.items.size, user), pool.items))
            if allowed.size:
                weights = pool.counts[allowed] if self.spec.popularity else np.ones(allowed.size, np.int64)
                cum = np.cumsum(weights)
                u = _unit(base[at], ATTEMPTS + 1)
                out[at] = allowed[np.minimum(np.searchsorted(cum, u * cum[-1], side="right"), allowed.size - 1)]
        return out

    def _pick(self, u: np.ndarray) -> np.ndarray:
        """Indices into ``pool.items`` for uniform numbers ``u`` [m] in [0, 1)."""
        n = self.pool.items.size
        if not self.spec.popularity:
            return np.minimum((u * n).astype(np.int64), n - 1)
        cum = self.cumulative
        return np.minimum(np.searchsorted(cum, u * cum[-1], side="right"), n - 1)

    @cached_property
    def pool(self) -> ItemPool:
        """The items negatives are drawn from: training's, and for validation and test also the split's own."""
        return ItemPool.of(self.train) if self.held is None else ItemPool.of(self.train).union(ItemPool.of(self.held))

    @cached_property
    def cumulative(self) -> np.ndarray:
        """[I] int64 the pool's counts summed up to each item (popularity draws)."""
        return np.cumsum(self.pool.counts)

    def _excluded(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        bad = self.train.has(users, items)
        if self.held is not None:
            bad |= self.held.has(users, items)
        return bad


def _unit(base: np.ndarray, attempt: int) -> np.ndarray:
    """[m] float64 in [0, 1): attempt ``attempt``'s number for each draw."""
    with np.errstate(over="ignore"):
        z = mix64(base + np.uint64(attempt) * _ATTEMPT)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def negative_salt(seed: int, split: str, epoch: int = 0) -> int:
    """The salt of a split's draws: test and validation ignore ``epoch`` (drawn once, kept fixed)."""
    tag = {"train": 1, "validation": 2, "test": 3}[split]
    return int(np.random.SeedSequence([seed, tag, epoch if split == "train" else 0]).generate_state(1, np.uint64)[0])


class NegativeRows:
    """A split's rows with their negatives (the :class:`~tierec.data.splits.Rows` protocol).

    ``sampler`` is called once per pass, in the pass's thread: the first pass of a
    :class:`~tierec.data.source.Dataset` makes its streaming pass over the training
    split (:class:`~tierec.data.interactions.Interactions`) then. A pass from row
    ``start_row`` (a resumed epoch) reads from the split's first row and skips
    ``start_row`` rows with their negatives: where a row's negatives fall depends on
    the rows before it.
    """

    def __init__(self, inner: Rows, sampler: Callable[[], NegativeSampler]) -> None:
        self.inner, self.sampler = inner, sampler

    def new_report(self) -> ProblemReport | None:
        return self.inner.new_report()

    def blocks(self, start_row: int, block_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        sampler = self.sampler()
        out = (sampler.expand(b) for b in self.inner.blocks(0, block_rows, report))
        return skip_rows(out, start_row) if start_row else out

    def chunks(self, rng: np.random.Generator, chunk_rows: int, report: ProblemReport | None) -> Iterator[RowBlock]:
        sampler = self.sampler()
        return (sampler.expand(b) for b in self.inner.chunks(rng, chunk_rows, report))
