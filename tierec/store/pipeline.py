"""StorePipeline: stage 3 of the training pipeline for tiered tables: the disk reads of the next window, and
the ids of the next ``horizon`` batches.

With a ``horizon`` (``store.horizon``) the stage pulls that many batches past
the one it hands out and shows each store the unique ids of every batch as it
comes (``foresee``, once per batch, in order): eviction ranks rows by their
next use among them (tierec/store/horizon.py). Nothing is read for them; the
batches held come on top of the read-ahead windows' (outside
``store.memory_budget``). ``depth`` 0 foresees without reading ahead
(``store.prefetch = false``).

Batches go through in order, in windows of up to ``depth`` (k) batches. Once the
previous window's first batch was looked up (``lead``: k - 1 batches before the
window starts; one for windows of 1 or 2), the rows of its batches are deduplicated
per tiered group and handed to the group's
:meth:`~tierec.store.group.TierStore.stage`, with the lookup each row is last
needed at; the group reads the ones that live only on disk on its read-ahead
threads, as one set (neighbouring records share a request), while the step
computes. A window is dropped once its last batch has been looked up (``HELD``: the caller may hold one
batch pulled ahead of the one it trains); once windows have run out of room, a batch earlier, where every
store says each of its batches was looked up from it (``release_looked_up``; the stage waits for a lookup
running then), so the next window has its room: at 16x fp32 with a horizon, windows of one batch then read
14.5k of a step's 15.0k disk rows ahead against 9.7k (0.32x of in memory against 0.30x). The stage runs on the
caller's thread between steps, or (``run(thread=True)``, where the training step leaves
the store a core) on a thread of its own, ``LAG`` batch ahead; the reads wait on
the device beside the compute. The windows' records have a share of the
memory budget (``spec.stage_bytes``): while a window's rows do not fit in it
(the rest would be read on demand), the next window is half as long, and while
the windows use less than half of it, twice as long, up to ``depth``: a small
budget reads ahead fewer batches at a time, not a truncated part of many.

The window's dedupe and probe also serve its batches' lookups: for a
collection that says how its forward reads a batch's ids
(``EmbeddingCollection.group_ids``), the window keeps each batch's positions
among its unique pairs and the rows its probe found
(:class:`~tierec.store.staging.WindowIds`), and the batch's lookup starts from
there (:meth:`~tierec.store.group.TierStore.resolve`) instead of its own
dedupe and probe. The positions and tables take 8 bytes per id of the
window's batches, beside the batches themselves, which the stage holds anyway
(outside ``store.memory_budget``, as the loader's batches are). With a
horizon the window starts from what ``foresee`` found of its batches
(:func:`~tierec.store.staging.compose_window`): one dedupe of their unique
pairs rather than of all their ids, and a probe of only the pairs that had no
row then; each batch held for the horizon keeps them (4 bytes per id, 20 per
unique pair). That took a window's stage from 37 to 16 ms of CPU at 4x with
int8 rows, the CPU burst of one step in four.

Exact by construction: reading ahead changes no number (a lookup uses a
record read ahead only while it is still the row's record; with fp32 cold rows
the group also keeps the window's rows in the fast tier, which moves rows but
changes no value), so any ``depth`` trains exactly as none
(tests/store/test_staging.py, tests/train/test_pipeline.py).

``stats()``: rows read ahead and used, the reads' wall time and the part of
it the step waited for (``wait_s``): the rest was hidden behind compute.
Measured (docs/performance.md, "Tables beyond memory"): windows of 4 read from
three batches ahead hid 98-100% of their reads at 4x with a horizon and a core
left to the store, against 37% (fp32 rows: 0.54x of in memory against 0.40x)
and 82% (int8) from one batch ahead; windows of 2 (16x) read from two ahead
left no room for the next (windows of 1, 3.4x the requests), windows of 4 beat 8 at 4x (8 outgrew its share of the budget), and
reading each next batch's newly evicted rows a step ahead cost more (a second
dedupe and probe per step) than it hid.

>>> from tierec.store.pipeline import StorePipeline
>>> pipe = StorePipeline([], depth=1)  # no tiered groups: batches pass through
>>> [b for b in pipe.run(iter([1, 2]))]
[1, 2]
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numba
import numpy as np

from tierec.data.loader import prefetch
from tierec.embedding.hash_index import Deduper
from tierec.store.staging import BatchIds, SeenBatch, compose_window

# A window is dropped once this many more batches were pulled after its last one: the training pipeline pulls the
# next batch before the step (to look it up ahead), so the batch pulled last may not be looked up yet.
HELD = 1
# Once a window could not hold all its rows, this many windows after it go as soon as their batches were looked up
# (a batch early: the stage waits for the lookup running then). Not for good after the first (16x int8: windows short
# only while the cache warmed up: the waits bought nothing there), nor only after a short one (16x fp32: windows that fit
# thanks to it and the next short again, in turns: 10.9k of 14.9k disk rows a step read ahead against 14.5k).
SHORT = 8
# A stage on a thread of its own (``run(thread=True)``) is this many batches ahead of the caller at most: it makes the
# next batch (foresees, stages its window) while the caller's step computes.
LAG = 1


@dataclass(frozen=True)
class _Target:
    """Where one prefetching storage's ids sit in a batch: (feature name, table index in the group); or, where
    the storage resolves batches from its windows (``resolve``), the collection's own reading of them."""

    group: Any  # tierec.embedding.storage.Prefetching
    features: tuple[tuple[str, int], ...]
    ids: Callable[[Any], tuple[np.ndarray, np.ndarray]] | None = None  # sparse -> (ids, tables) as looked up

    def batch_ids(self, sparse: Any) -> tuple[np.ndarray, np.ndarray]:
        """(ids [n], tables [n] int32) of a batch for this storage."""
        if self.ids is not None:
            return self.ids(sparse)
        keys, tabs = [], []
        for f, ti in self.features:
            if f not in sparse.keys:
                continue
            lo, hi = sparse.feature_span(sparse.index(f))
            keys.append(sparse.values[lo:hi].numpy())
            tabs.append(np.full(hi - lo, ti, dtype=np.int32))
        if not keys:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int32)
        return np.concatenate(keys), np.concatenate(tabs)


def targets_of(collections: list[Any]) -> list[_Target]:
    """The storages of some EmbeddingCollections that can prefetch, with the features each reads."""
    out = []
    for coll in collections:
        ids_of = getattr(coll, "group_ids", None)  # optional: a batch's ids of a group as its forward reads them
        for gi, g in enumerate(coll.groups):
            p = g.prefetcher()
            if p is not None:
                feats = tuple((f, ti) for ti, t in enumerate(g.tables) for f in t.features)
                resolves = ids_of is not None and getattr(p, "resolve", None) is not None
                out.append(_Target(group=p, features=feats, ids=partial(ids_of, gi) if resolves else None))
    return out


class StorePipeline:
    def __init__(self, collections: list[Any], depth: int = 1, horizon: int = 0) -> None:
        """``depth``: batches per read-ahead window at most (0: no reading ahead); ``horizon``: batches whose
        ids each store sees ahead of their lookups (``foresee``), 0 for none."""
        if depth < 0 or horizon < 0 or depth == horizon == 0:
            raise ValueError("the store pipeline reads ahead (depth >= 1), foresees (horizon >= 1) or both")
        self.targets = targets_of(collections)
        self.depth = depth
        self.horizon = horizon
        self.wait_s = 0.0  # the step waiting for the batches upstream (the loader)
        self.stage_s = 0.0  # this stage's own time on the caller's thread (dedupe, starting the reads)
        self.batches = 0
        self.window = depth  # batches in the next window: ``depth`` at most, fewer where they do not fit (_adapt)
        self.smallest_window = depth
        self._dropped = 0  # rows the windows could not hold, so far
        self.released_early = 0  # windows dropped a batch early for want of room
        self._short = 0  # windows to come that go early (SHORT after one that could not hold all its rows)
        self._dedupe = Deduper()
        # showing the stores the ids of the horizon's batches, waits included: a store looking up the next batch
        # ahead holds its lock meanwhile (the step would wait for that lookup anyway)
        self.foresee_s = 0.0

    def stats(self) -> dict[str, float]:
        st = [t.group.staging.stats for t in self.targets]
        read_s, wait_s = sum(s.read_s for s in st), sum(s.wait_s for s in st)
        return {
            "wait_s": wait_s,
            "read_ahead_s": read_s,
            "hidden_share": 1.0 - wait_s / read_s if read_s > 0 else float("nan"),
            "stage_s": self.stage_s,
            "foresee_s": self.foresee_s,
            "horizon": self.horizon,
            "staged_rows": sum(s.staged_rows for s in st),
            "staged_used_rows": sum(s.used_rows for s in st),
            "resolved_batches": sum(s.resolved_batches for s in st),
            "batches": self.batches,
            "depth": self.depth,
            "window": self.window,
            "smallest_window": self.smallest_window,
            "released_early": self.released_early,
        }

    def stage(self, window: list[Any], first: int, seen: list[list[SeenBatch]] | None = None) -> list[tuple[Any, int]]:
        """Start the reads of a window of batches, the first of them ``first`` lookups from now, in every tiered
        group; (group, token) of each. ``seen``: per batch, what ``foresee`` found of it (per target)."""
        t0 = time.perf_counter()
        tokens = []
        for i, t in enumerate(self.targets):
            keys, tabs = [], []
            for batch in window:
                ids, tb = t.batch_ids(batch.sparse if hasattr(batch, "sparse") else batch)
                keys.append(ids.astype(np.int64, copy=False))
                tabs.append(tb)
            if not sum(k.shape[0] for k in keys):
                continue
            found = None
            if seen is None:
                k, tb, inverse = self._dedupe(np.concatenate(keys), np.concatenate(tabs))
                ends = np.cumsum([x.shape[0] for x in keys])
                pos = np.split(inverse.astype(np.int32), ends[:-1])  # each batch's positions among the unique pairs
            else:
                k, tb, pos, found = compose_window([s[i] for s in seen], self._dedupe)
            next_use = np.zeros(k.shape[0], dtype=np.int32)
            for j, p in enumerate(pos):  # the window's last use of each row: later batches write over earlier ones
                next_use[p] = first + j
            if t.ids is None:
                token = t.group.stage(k, tb, next_use)
            else:  # the window keeps each batch's positions among its unique pairs, for the batch's lookup
                token = t.group.stage(k, tb, next_use, [BatchIds(x, y, p) for x, y, p in zip(keys, tabs, pos)], found)
            if token is not None:
                tokens.append((t.group, token))
        self.stage_s += time.perf_counter() - t0
        return tokens

    def foresee(self, batch: Any) -> list[SeenBatch]:
        """Show every store the unique ids of the next batch (after those shown before) for its horizon; per
        target, what it found (for the window that will hold the batch; nothing without windows)."""
        t0 = time.perf_counter()
        seen = []
        for t in self.targets:
            ids, tb = t.batch_ids(batch.sparse if hasattr(batch, "sparse") else batch)
            k, tb, inverse = self._dedupe(ids.astype(np.int64, copy=False), tb)
            found = t.group.foresee(k, tb)
            if self.depth:  # k: a view of n ids
                seen.append(SeenBatch(k.copy(), tb.copy(), inverse.astype(np.int32), found))
        self.foresee_s += time.perf_counter() - t0
        return seen

    def run(self, batches: Iterable[Any], thread: bool = False) -> Iterator[Any]:
        """The batches of ``batches`` in order, the disk reads of the next window running behind each.

        ``thread``: the stage (pulling, foreseeing, starting the reads) runs on a thread of its own,
        ``LAG`` batch ahead of the caller, instead of on the caller's thread between steps (the
        training pipeline's choice where it leaves the store a core)."""
        if not self.targets:
            return iter(batches)
        if not thread:
            return self._run(batches, lag=0, clear=True)
        return self._on_thread(batches)

    def _on_thread(self, batches: Iterable[Any]) -> Iterator[Any]:
        def staged() -> Iterator[Any]:  # called on the stage's thread
            # its kernels serial: the dense step's team stays the only one (a second OpenMP team on 2 cores
            # throttles the runtime's spinning, in the step's team too)
            numba.set_num_threads(1)
            return self._run(batches, lag=LAG, clear=False)

        try:
            yield from prefetch(staged, 1, name="tierec-stage", lockstep=True)
        finally:  # once the caller has had the last batch: the thread ends earlier, and the horizon ranks until then
            self._clear()

    def _run(self, batches: Iterable[Any], lag: int, clear: bool) -> Iterator[Any]:
        """``run``'s stream, handed out up to ``lag`` batches ahead of the caller's: a window is read and dropped
        at the lookups' same point as with none (``lag`` batches later by this stream's count), and its rows are
        wanted ``lag`` lookups later than its position here says. ``clear``: the windows and the horizon's batches
        go at the end (else the caller clears them, once it has had the last batch)."""
        source = iter(batches)
        ahead: deque[Any] = deque()  # batches t, t + 1, ... pulled from the source
        seen: deque[list[SeenBatch]] = deque()  # with a horizon and windows: what foresee found of each batch in ``ahead``
        windows: deque[tuple[int, list[tuple[Any, int]]]] = deque()  # (batch after its last, tokens)

        def pull(n: int) -> None:
            while len(ahead) < n:
                t0 = time.perf_counter()
                try:
                    ahead.append(next(source))
                except StopIteration:
                    break
                finally:
                    self.wait_s += time.perf_counter() - t0
                if self.horizon:
                    looked = self.foresee(ahead[-1])
                    if looked:  # kept for the batch's window (without reading ahead there is none)
                        seen.append(looked)

        t = start = 0  # the next batch to hand out; the first batch of the next window
        try:
            while True:
                while windows and windows[0][0] + HELD + lag <= t:  # its batches are all looked up
                    self._release(windows.popleft()[1])
                # while windows run out of room: a batch earlier where the stores say so, and the next window gets
                # the room (on a thread of its own batch t - 2's lookup is done or running: the caller took t - 1;
                # this waits for it)
                while self._short and windows and windows[0][0] + lag <= t and self._release_looked_up(windows[0][1]):
                    windows.popleft()
                    self.released_early += 1
                # the next window starts soon: read it (``lag`` batches ahead, at the lookups' same point as without)
                while self.depth and t + max(1, self.window - 1) >= start + lag:
                    pull(start - t + self.window)
                    window = list(ahead)[start - t : start - t + self.window]
                    if not window:
                        break
                    looks = list(seen)[start - t : start - t + len(window)] if seen else None
                    windows.append((start + len(window), self.stage(window, start - t + 1 + lag, looks)))  # t: lookup 1
                    start += len(window)
                    self._adapt()
                pull(1 + self.horizon)  # batch t, and the horizon's batches after it foreseen
                if not ahead:
                    return
                t += 1
                self.batches += 1
                if seen:
                    seen.popleft()
                yield ahead.popleft()
        finally:
            for _, w in windows:
                self._release(w)
            if clear:
                self._clear()

    def _clear(self) -> None:
        """Every window and the horizon's batches go (the stream ended)."""
        for tg in self.targets:
            tg.group.release_staged()

    def _adapt(self) -> None:
        """The next window's length: halved while a window's rows do not fit in the memory the windows have
        (rows were dropped: read on demand after all), doubled up to ``depth`` while the windows held use
        less than half of it."""
        dropped, held, room = 0, 0, 0
        for tg in self.targets:
            d, h, r = tg.group.read_ahead_fill()
            if r is None:
                return  # no bound: the full depth always fits
            dropped, held, room = dropped + d, held + h, room + r
        self._short = SHORT if dropped > self._dropped else max(self._short - 1, 0)
        if dropped > self._dropped:
            self.window = max(1, self.window // 2)
        elif 2 * held < room:
            self.window = min(self.depth, 2 * self.window)
        self._dropped = dropped
        self.smallest_window = min(self.smallest_window, self.window)

    @staticmethod
    def _release_looked_up(window: list[tuple[Any, int]]) -> bool:
        """Drop a window where every store looked each of its batches up from it (one no store staged: at once);
        False if one did not, or cannot say (``release_looked_up``): the window then goes at its usual point."""
        if any(getattr(g, "release_looked_up", None) is None for g, _ in window):
            return False
        return all([g.release_looked_up(tok) for g, tok in window])  # (a list: each store drops what it can)

    @staticmethod
    def _release(window: list[tuple[Any, int]]) -> None:
        for group, token in window:
            group.release_staged(token)
