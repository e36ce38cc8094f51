"""Horizon: when each row is next needed, from the ids of the next K training batches.

The training pipeline shows a tiered store the ids of upcoming batches long
before their rows are read (``store.horizon`` batches ahead, against the
few batches a read-ahead window holds). The store keeps, per row (lid), the
training lookup that next uses it, and eviction ranks by it: a row used inside
the horizon stays in memory before any row that is not (the sooner its next
use, the later it leaves), and rows not used inside it leave by their access
counts, as without a horizon. Simulated on the disk benchmark's trace
(benchmarks/tiers_sim.py: ``windowed``), 64 batches of ids bring the rows read
from disk within 1.2x of Belady's minimum, where 4 leave them at 1.5-1.7x.

Bookkeeping: each foreseen batch keeps its rows (lids) and, per row, the
batch after it inside the horizon that uses the row again (``follow``; linked
when that batch is foreseen). A row's next use is set when it is foreseen
with no earlier use pending, and moves on along its links as the training
lookups consume the batches. 12 bytes per row of the store and 8 per id of
the foreseen batches.

Deterministic whatever the threads' timing: a lookup at training step ``s``
ranks by the uses in steps ``s + 1 .. s + K`` only, whatever was foreseen
beyond them, and the pipeline foresees step ``s + K`` before it hands out
batch ``s``. Ids a store has no row for yet are not foreseen (a new row's
uses count once its batch is foreseen after it was made).

>>> import numpy as np
>>> h = Horizon(2)
>>> h.foresee(np.array([5, 7]), at=1); h.foresee(np.array([7]), at=2); h.foresee(np.array([5]), at=3)
>>> h.next_use(np.array([5, 7, 9]), step=0).tolist()  # row 9 is not foreseen
[1, 1, 0]
>>> h.advance(1); h.next_use(np.array([5, 7, 9]), step=1).tolist()  # step 1 consumed: the next uses move on
[3, 2, 0]
>>> h.next_use(np.array([5]), step=0).tolist()  # at step 0 a use at step 3 is past the horizon of 2
[0]
"""

from __future__ import annotations

from collections import deque

import numba as nb
import numpy as np

BEFORE_ALL = float(1 << 52)  # scores of rows used inside the horizon: above every access count and step


@nb.njit(cache=True, nogil=True)
def _foresee(lids, at, step, next_at, last_at, last_pos, follow, base):
    """Enter batch ``at``'s rows (its follow links start at ``base``): a row with a use still pending links
    from it; any other row is next used at ``at``."""
    for i in range(lids.shape[0]):
        x = lids[i]
        follow[base + i] = 0
        if last_at[x] > step:
            follow[last_pos[x]] = at
        else:
            next_at[x] = at
        last_at[x] = at
        last_pos[x] = base + i


@nb.njit(cache=True, nogil=True)
def _advance(lids, at, follow, base, next_at):
    """Batch ``at`` is being looked up: its rows move on to their next foreseen use (0: none)."""
    for i in range(lids.shape[0]):
        x = lids[i]
        if next_at[x] == at:
            next_at[x] = follow[base + i]


@nb.njit(cache=True, nogil=True)
def _ranked(score, slot_lid, next_at, step, until, out):
    """Per slot: ``BEFORE_ALL - next use`` for rows used in steps ``step + 1 .. until``, else ``score``."""
    n = next_at.shape[0]
    for s in range(score.shape[0]):
        x = slot_lid[s]
        out[s] = score[s]
        if 0 <= x < n:
            t = next_at[x]
            if step < t <= until:
                out[s] = BEFORE_ALL - t


class Horizon:
    """Next uses of a store's rows from the ids of up to ``length`` upcoming training batches (see the module)."""

    def __init__(self, length: int) -> None:
        if length < 0:
            raise ValueError("the horizon's length must be >= 0")
        self.length = length
        self.next_at = np.zeros(0, dtype=np.int32)  # [lids] the training step that next uses each row; 0: none foreseen
        self.last_at = np.zeros(0, dtype=np.int32)  # [lids] the latest foreseen step that uses it
        self.last_pos = np.zeros(0, dtype=np.int32)  # [lids] ... its place among the follow links
        self.follow = np.zeros(1024, dtype=np.int32)  # per foreseen id: its row's next foreseen step after it
        self.batches: deque[tuple[int, np.ndarray, int]] = deque()  # (step, lids, base in follow), oldest first
        self._end = 0  # follow links in use: those of the batches held, from self.batches[0]'s base
        self.foreseen_to = 0  # the step of the last batch foreseen (0: none since the last clear)

    def nbytes(self) -> int:
        return self.next_at.nbytes + self.last_at.nbytes + self.last_pos.nbytes + self.follow.nbytes \
            + sum(b[1].nbytes for b in self.batches)

    def _fit(self, rows: int, ids: int) -> None:
        if rows > self.next_at.shape[0]:
            n = max(rows, 2 * self.next_at.shape[0])
            for name in ("next_at", "last_at", "last_pos"):
                old = getattr(self, name)
                new = np.zeros(n, dtype=np.int32)
                new[: old.shape[0]] = old
                setattr(self, name, new)
        if self._end + ids > self.follow.shape[0]:  # links of consumed batches go; the rest move to the front
            base = self.batches[0][2] if self.batches else self._end
            live = self.follow[base : self._end]
            if live.shape[0] + ids > self.follow.shape[0] // 2:
                grown = np.zeros(2 * (live.shape[0] + ids), dtype=np.int32)
                grown[: live.shape[0]] = live
                self.follow = grown
            else:
                self.follow[: live.shape[0]] = live
            self.batches = deque((at, lids, b - base) for at, lids, b in self.batches)
            self.last_pos[: self.next_at.shape[0]] -= np.int32(base)  # only pending rows' positions are read
            self._end = live.shape[0]

    def foresee(self, lids: np.ndarray, at: int | None = None, step: int = 0) -> None:
        """The rows (unique lids) of the batch the training lookup number ``at`` will look up (None: the one
        after the last foreseen, or the next lookup's); ``step``: the training lookups done so far. Batches
        come in the order of their steps."""
        lids = np.ascontiguousarray(lids, dtype=np.int64)
        at = max(self.foreseen_to, step) + 1 if at is None else at
        self.foreseen_to = at
        if self.length == 0 or at <= step:
            return
        self._fit(int(lids.max()) + 1 if lids.size else 0, lids.shape[0])
        _foresee(lids, np.int32(at), np.int32(step), self.next_at, self.last_at, self.last_pos, self.follow, self._end)
        self.batches.append((at, lids, self._end))
        self._end += lids.shape[0]

    def advance(self, step: int) -> None:
        """The training lookup number ``step`` starts: batches up to it are consumed."""
        while self.batches and self.batches[0][0] <= step:
            at, lids, base = self.batches.popleft()
            _advance(lids, np.int32(at), self.follow, base, self.next_at)
        if not self.batches:
            self._end = 0

    def clear(self) -> None:
        """Forget every foreseen batch (the pipeline stopped)."""
        for _, lids, _ in self.batches:
            self.next_at[lids] = 0
            self.last_at[lids] = 0
        self.batches.clear()
        self._end = 0
        self.foreseen_to = 0

    def forget(self, lids: np.ndarray) -> None:
        """Rows deleted (their lids may be given to new rows): no next use."""
        lids = lids[lids < self.next_at.shape[0]]
        self.next_at[lids] = 0

    @property
    def active(self) -> bool:
        return bool(self.batches)

    def next_use(self, lids: np.ndarray, step: int) -> np.ndarray:
        """The step [n] that next uses each row inside steps ``step + 1 .. step + length``; 0 where none does."""
        out = np.zeros(lids.shape[0], dtype=np.int32)
        known = lids < self.next_at.shape[0]
        t = self.next_at[lids[known]]
        out[known] = np.where((t > step) & (t <= step + self.length), t, 0)
        return out

    def ranked(self, score: np.ndarray, lids: np.ndarray, step: int) -> np.ndarray:
        """``score`` [n] (float64) of rows ``lids`` (-1: none) with rows used inside the horizon above all others,
        the sooner the higher: what eviction ranks by (the lowest leave first)."""
        out = np.empty(score.shape[0], dtype=np.float64)
        _ranked(score, np.ascontiguousarray(lids, dtype=np.int64), self.next_at, np.int32(step),
                np.int32(step + self.length), out)
        return out
