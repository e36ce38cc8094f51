"""HotnessPass: the periodic hotness pass of a TieredGroup, and the host tier's demotions.

Every ``interval`` training steps, at the start of a training lookup (so no
batch is in flight and the result depends only on the access history, never on
which rows happened to be resident or prefetched):

1. decay: access counts are multiplied by ``decay``;
2. time-to-live: rows unused for more than ``ttl_steps`` are deleted;
3. LFU over capacity: beyond ``max_rows``, the least used rows are deleted
   (ties broken by a hash of the id, so the choice is reproducible);
4. placement (``promote_max`` rows at most): the hottest rows not in the fast
   tier move up in place of colder ones, and between host and disk the
   hottest disk rows move to host in place of colder host rows;
5. the disk tier compacts its emptiest segments and drops its pages.

Deleting a row really frees it: its fast-tier slot, its host or disk slot and
its directory entry; if the id comes back it starts afresh.

The pass is given the group's parts it works on (directory, fast tier, host,
disk, spec) and the few row moves it needs (a :class:`~tierec.store.moves.TierMoves`);
the group's clocks come with each call. The caller holds the group's lock.
"""

from __future__ import annotations

import time

import numpy as np

from tierec.store import hotness
from tierec.store.demotion import ColdHostRows
from tierec.store.directory import LOC_DISK, LOC_HOST, Directory
from tierec.store.disk import DiskTier
from tierec.store.fast_tier import FastTier
from tierec.store.horizon import Horizon
from tierec.store.host import HostTier
from tierec.store.moves import TierMoves
from tierec.sizes import release_free_memory
from tierec.store.spec import CachePolicy, Counter, TierSpec


class HotnessPass:
    """The hotness pass and the host tier's demotions over a tiered group's directory and tiers; rows move
    through ``moves`` (take_slots, bring_up, free_rows, count, note_deleted)."""

    def __init__(
        self, index: Directory, spec: TierSpec, fast: FastTier, host: HostTier | None, disk: DiskTier | None,
        moves: TierMoves, horizon: Horizon,
    ) -> None:
        self.index = index
        self.spec = spec
        self.fast = fast
        self.host = host
        self.disk = disk
        self.moves = moves
        self.horizon = horizon  # next uses: the demotion order (tierec/store/demotion.py)
        # host rows in the order they leave for disk, ranked at most once per pass while enough are left
        self._cold = ColdHostRows(index, horizon, host.max_rows if host is not None else None)

    def maintain(self, clock: int, train_steps: int) -> None:
        """The pass, at lookup number ``clock`` (``train_steps`` of them training)."""
        d, spec = self.index, self.spec
        if spec.decay < 1.0:
            d.decay(spec.decay)
        if spec.ttl_steps:
            old = [lids[train_steps - d.last[lids] > spec.ttl_steps] for lids in d.live_spans()]
            self.delete_rows(np.concatenate(old) if old else np.empty(0, dtype=np.int64), Counter.DELETED_TTL)
        if spec.max_rows and d.num_rows > spec.max_rows:
            live = d.live()
            order = np.lexsort((d.hashes(live), d.freq[live]))  # least used first
            self.delete_rows(live[order[: d.num_rows - spec.max_rows]], Counter.DELETED_LFU)
        if spec.promote_max:
            if spec.cache_policy is CachePolicy.LFU:
                self._promote_to_cache(spec.promote_max, clock)
            self._rebalance_host_disk(spec.promote_max)
        if self.disk is not None:
            self.compact()
            self.disk.drop_page_cache()
        self._cold.forget()  # the counts moved on: the next demotion ranks the host rows again
        release_free_memory()

    def compact(self, most: int | None = None) -> None:
        """The disk tier's compaction (at most ``most`` records moved; DiskTier.compact), the moved rows' homes
        updated."""
        started = time.perf_counter()
        lids, slots = self.disk.compact(most)
        self.index.home[lids] = slots
        self.moves.rehome(lids, slots, started)

    # -------------------------------------------------- host rows making room

    def nbytes(self) -> int:  # the demotion queue's
        return self._cold.nbytes()

    def came_to_host(self, lids: np.ndarray, step: int) -> None:
        """Rows ``lids`` were just homed on the host at training step ``step`` (demotion candidates from now on)."""
        self._cold.came(lids, step)

    def demote_colder(self, incoming: np.ndarray, need: int, step: int = 0) -> None:
        """Make up to ``need`` host slots for rows leaving the fast tier (``incoming``: their ranks, as the
        horizon ranks them: Horizon.ranked) by moving host rows that rank below them to disk, the lowest first
        (tierec/store/demotion.py; ``step``: the training lookups so far). Without it a host tier filled once
        (by a load, or early in a run) keeps rows that are never used again while hotter rows go to disk."""
        d = self.index
        cand, ranks = self._cold.candidates(need, step)
        if cand.size == 0:
            return
        hot = np.sort(incoming)[::-1][: cand.size]
        n = int(np.count_nonzero(hot > ranks))  # both sorted: a prefix
        if n == 0:
            return
        down = cand[:n]
        hs = d.home[down].astype(np.int64)
        recs = self.host.read(hs)
        self.host.free(hs)
        d.home[down] = self.disk.append(down, recs)
        d.loc[down] = LOC_DISK
        self.moves.count(Counter.DISK_WRITE_ROWS, d.tabs[down])
        self.moves.count(Counter.DEMOTED, d.tabs[down])

    def delete_rows(self, lids: np.ndarray, counter: Counter) -> None:
        if lids.size == 0:
            return
        self.moves.count(counter, self.index.tabs[lids])
        self.moves.note_deleted(self.index.keys[lids], self.index.tabs[lids])
        self.moves.free_rows(lids)
        self.index.delete(lids)

    def _extreme(self, k: int, loc: int | None, hottest: bool) -> np.ndarray:
        """lids of the ``k`` most (least) accessed rows away from the fast tier (homed in ``loc`` if given),
        hottest (coldest) first; ties by lid (Directory.extreme_away)."""
        return self.index.extreme_away(k, loc, hottest)

    def _promote_to_cache(self, most: int, clock: int) -> None:
        d = self.index
        hot = self._extreme(most, None, hottest=True)
        if hot.size == 0:
            return
        n = min(self.fast.n_free, hot.size)
        rest = hot[n:]
        if rest.size:
            _, scores = self.fast.evictable(clock, d.resident_scores(True))
            cold = np.sort(scores[hotness.lowest(scores, rest.size)])
            k = min(rest.size, cold.size)
            n += int(np.count_nonzero(d.freq[rest[:k]] > cold[:k]))  # both sorted: a prefix
        if n == 0:
            return
        slots = self.moves.take_slots(n, True)  # best effort
        up = hot[: slots.size]
        _, _, loc, home = d.where(up)
        self.moves.bring_up(up, slots, loc, home)
        self.moves.count(Counter.PROMOTED, d.tabs[up])

    def place_by_hotness(self) -> None:
        """After a checkpoint's rows were loaded (host first, then disk, in the order they came): the host tier
        takes the hottest rows away from the fast tier by the access counts the checkpoint carried, the rest
        go to disk, as a run that had trained there would hold them. Moves rows only (their values and the
        run's counters stay as loaded)."""
        if self.host is None or self.disk is None or self.host.max_rows is None:
            return
        self._rebalance_host_disk(self.host.max_rows, count=False)

    def _rebalance_host_disk(self, most: int, count: bool = True) -> None:
        if self.host is None or self.disk is None:
            return
        d = self.index
        hot = self._extreme(most, LOC_DISK, hottest=True)
        if hot.size == 0:
            return
        fill = min(self.host.free_rows if self.host.free_rows is not None else hot.size, hot.size)
        rest = hot[fill:]
        n_swap = 0
        if rest.size:
            cold = self._extreme(rest.size, LOC_HOST, hottest=False)
            k = min(rest.size, cold.size)
            n_swap = int(np.count_nonzero(d.freq[rest[:k]] > d.freq[cold[:k]]))
            if n_swap:  # host -> disk first, which frees their host slots
                down = cold[:n_swap]
                hs = d.home[down]
                recs = self.host.read(hs)
                self.host.free(hs)
                d.home[down] = self.disk.append(down, recs)
                d.loc[down] = LOC_DISK
                if count:
                    self.moves.count(Counter.DISK_WRITE_ROWS, d.tabs[down])
        up = hot[: fill + n_swap]
        if up.size == 0:
            return
        ds = d.home[up]
        recs = self.disk.read(ds, up)
        self.disk.free(ds)
        hs = self.host.alloc(up.size)
        self.host.write(hs, recs)
        d.home[up] = hs
        d.loc[up] = LOC_HOST
        if count:
            self.moves.count(Counter.DISK_READ_ROWS, d.tabs[up])
            self.moves.count(Counter.PROMOTED, d.tabs[up])
