"""TierRecords: the checkpoint records of a TieredGroup, every tier's rows plus the statistics.

``records(t, lids)`` returns the plain group's keys (``ids``, ``weights``,
``opt.*``) of rows in any tier, plus ``store.freq`` and ``store.last`` per row;
``embedding.storage.record_chunks`` streams a table's rows in lid order, a bounded
chunk at a time (a checkpoint never holds the table). ``table_meta(t)`` is the
table's ``store.counters``; table 0 also carries the group's clocks and the
admission sketch. A plain TableGroup loads such a state (it ignores the
``store.*`` keys) and a TieredGroup loads a plain one. Loaded rows go to host,
then disk; the fast tier warms up again as batches arrive, which changes no
number.

Except with a lossy cold codec (``store.cold_precision`` bf16 / int8): a row
is rounded each time it leaves the fast tier, so the numbers depend on which
rows sit in the fast tier, and in which slots (eviction breaks ties by
slot). Then every row also carries ``store.slot`` (its fast-tier slot, -1
when away) and table 0 the order of the free slots, and a group that loads
them into an empty fast tier of the same capacity puts the rows back where
they were: a resumed run equals the uninterrupted one. Rows read from the
cold tiers are decoded to float32 and encode to the same values again (the
codecs are idempotent), so the checkpoint format stays float32.

The records are given the group's parts they read and write (directory, fast
tier, host, disk, codec, admission, counters) and the few row moves they need
(a :class:`~tierec.store.moves.TierMoves`); the group's clocks come with each
call that uses them (:class:`Clocks`). The caller holds the group's lock.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from tierec.store.admission import Admission
from tierec.store.codec import RowCodec
from tierec.store.directory import LOC_DISK, LOC_HOST, Directory
from tierec.store.disk import DiskTier
from tierec.store.fast_tier import FastTier
from tierec.store.host import HostTier
from tierec.store.moves import TierMoves
from tierec.store.spec import Counter


class Clocks(NamedTuple):
    """A tiered group's clocks, as a checkpoint carries them."""

    clock: int  # lookups so far (training and evaluation)
    train_steps: int  # training lookups so far
    max_batch_rows: int  # most unique rows one training lookup needed


class TierRecords:
    """Checkpoint records of a tiered group's rows and statistics. Rows are read through ``moves.read_rows``,
    homed through ``moves.store_away`` and noted through ``moves.note``; the fast tier gives the record layout
    (``dim``, ``state``, ``state_widths``, ``record_width``, ``capacity``)."""

    def __init__(
        self,
        index: Directory,
        fast: FastTier,
        codec: RowCodec,
        host: HostTier | None,
        disk: DiskTier | None,
        admission: Admission,
        counters: np.ndarray,
        moves: TierMoves,
    ) -> None:
        self.index = index
        self.fast = fast
        self.codec = codec
        self.host = host
        self.disk = disk
        self.admission = admission
        self.counters = counters  # [n_tables, len(Counter)], the group's (written in place)
        self.moves = moves
        self._saved_free: np.ndarray | None = None  # free-slot stack of a checkpoint being loaded

    def row_extent(self) -> int:
        return self.index.high

    def rows_of(self, t: int, lo: int, hi: int) -> np.ndarray:
        return lo + np.flatnonzero(self.index.tabs[lo:hi] == t)

    def records(self, t: int, rows: np.ndarray) -> dict[str, Tensor]:
        """Records of rows (lids) ``rows`` from whichever tier holds them, with ``store.freq`` / ``store.last``."""
        d, dim = self.index, self.fast.dim
        rec = self.moves.read_rows(rows)  # [n, W]
        n = rows.size
        out = {"ids": torch.from_numpy(d.keys[rows]), "weights": torch.from_numpy(rec[:, :dim].copy())}
        col = dim
        for name, s in self.fast.state.items():
            w = self.fast.state_widths[name]
            out[f"opt.{name}"] = torch.from_numpy(rec[:, col : col + w].reshape(n, *s.shape[1:]).copy())
            col += w
        out["store.freq"] = torch.from_numpy(np.asarray(d.freq[rows], dtype=np.float32))
        out["store.last"] = torch.from_numpy(np.asarray(d.last[rows], dtype=np.int32))
        if self.codec.lossy:  # where the row sits in the fast tier (see the module docstring)
            out["store.slot"] = torch.from_numpy(np.asarray(d.cslot[rows], dtype=np.int32))
        return out

    def table_meta(self, t: int, clocks: Clocks) -> dict[str, Tensor]:
        """Table ``t``'s ``store.counters``; table 0 also the group's ``clocks`` and the admission sketch."""
        out = {"store.counters": torch.from_numpy(self.counters[t].copy())}
        if t == 0:
            table, added = self.admission.sketch_state()
            out["store.clock"] = torch.tensor([clocks.clock, clocks.train_steps, clocks.max_batch_rows, added])
            if table is not None:
                out["store.sketch"] = torch.from_numpy(table)
            if self.codec.lossy:  # the free fast-tier slots, bottom of the stack first
                out["store.free_slots"] = torch.from_numpy(self.fast.free_slots[: self.fast.n_free].astype(np.int32))
                out["store.capacity"] = torch.tensor([self.fast.capacity], dtype=torch.int64)
                # the slots the next lookups may not evict yet (store.lookup_ahead: the last lookup's), by age
                ages = clocks.clock - self.fast.pin
                held = np.flatnonzero((self.fast.slot_lid >= 0) & (ages < self.fast.in_flight - 1))
                out["store.pinned_slots"] = torch.from_numpy(np.stack([held, ages[held]]).astype(np.int64))
        return out

    def load_table_meta(self, t: int, sd: dict[str, Tensor]) -> Clocks | None:
        """Put back what ``table_meta`` gave; returns the group's clocks when ``sd`` carries them."""
        clocks = None
        if "store.clock" in sd:
            clock, train_steps, max_batch_rows, added = (int(x) for x in sd["store.clock"])
            clocks = Clocks(clock, train_steps, max_batch_rows)
            if "store.sketch" in sd:
                self.admission.load_sketch(sd["store.sketch"].numpy(), added)
        if "store.counters" in sd:
            c = sd["store.counters"].numpy()
            self.counters[t, : c.shape[0]] = c[: len(Counter)]
        if "store.free_slots" in sd:  # put the fast tier back as it was, if it is the same and empty
            same = int(sd["store.capacity"][0]) == self.fast.capacity and self.index.num_rows == 0
            self._saved_free = sd["store.free_slots"].numpy().astype(np.int64) if same else None
            if same:
                self.fast.restack(self._saved_free)
                if "store.pinned_slots" in sd and clocks is not None:  # pinned as they were; rows come in below (_place)
                    held, ages = sd["store.pinned_slots"].numpy()
                    self.fast.pin[held] = clocks.clock - ages
        return clocks

    def write_records(self, t: int, sd: dict[str, Tensor], train_steps: int) -> None:
        """Insert or overwrite rows; they go to host, then disk (the fast tier warms up again), or with
        ``store.slot`` back into their fast-tier slots (see the module docstring). New rows without
        ``store.last`` were last used at ``train_steps``."""
        ids = sd["ids"].numpy().astype(np.int64, copy=False)
        n = ids.shape[0]
        dim = self.fast.dim
        rec = np.empty((n, self.fast.record_width), dtype=np.float32)
        rec[:, :dim] = sd["weights"].numpy()
        col = dim
        for name in self.fast.state:
            w = self.fast.state_widths[name]
            rec[:, col : col + w] = sd[f"opt.{name}"].numpy().reshape(n, w)
            col += w
        freq = sd["store.freq"].numpy() if "store.freq" in sd else None
        last = sd["store.last"].numpy() if "store.last" in sd else None
        slots = sd["store.slot"].numpy().astype(np.int64) if "store.slot" in sd and self._saved_free is not None else None
        self._put(ids, np.full(n, t, dtype=np.int32), rec, train_steps, freq, last, slots)

    def put_records(self, keys: np.ndarray, tabs: np.ndarray, records: np.ndarray, train_steps: int) -> None:
        """Overwrite (or insert) rows of (table, id) pairs with ``records`` [n, W]; known rows keep their
        access statistics (a move between ranks, e.g. a hot row handed back to its owner), new ones were
        last used at ``train_steps``."""
        self._put(keys, tabs.astype(np.int32, copy=False), np.ascontiguousarray(records, dtype=np.float32), train_steps)

    def _put(self, ids: np.ndarray, tabs: np.ndarray, rec: np.ndarray, train_steps: int, freq=None, last=None, slots=None) -> None:
        d = self.index
        n = ids.shape[0]
        self.moves.note(ids, tabs)
        lids = d.find(ids, tabs)
        known = np.flatnonzero(lids >= 0)
        if known.size:  # overwrite rows in place: cached copies in the cache, others re-homed
            kl = lids[known]
            cs = d.cslot[kl].astype(np.int64)
            res = cs >= 0
            self.fast.scatter(cs[res], rec[known[res]])
            self.fast.dirty[cs[res]] = True
            away = kl[~res]
            loc = d.loc[away]
            if self.host is not None:
                self.host.free(d.home[away[loc == LOC_HOST]])
            if self.disk is not None:
                self.disk.free(d.home[away[loc == LOC_DISK]])
            d.loc[away] = 0
            d.home[away] = -1
            if freq is not None:
                d.freq[kl] = freq[known]
            if last is not None:
                d.last[kl] = last[known]
            self.moves.store_away(away, rec[known[~res]])
        new = np.flatnonzero(lids < 0)
        if new.size:
            nl = d.insert(ids[new], tabs[new])
            home = np.ones(new.size, dtype=bool)
            if slots is not None:  # back into their fast-tier slots first (then freq and last are exact there)
                s = slots[new]
                home = (s < 1) | (s > self.fast.capacity)
                home[~home] = self.fast.slot_lid[s[~home]] >= 0  # taken (a checkpoint of several processes) ...
                cand = np.flatnonzero(~home)
                home[cand] = True
                home[cand[np.unique(s[cand], return_index=True)[1]]] = False  # ... or claimed twice
                self._place(nl[~home], s[~home], rec[new[~home]])
            d.freq[nl] = freq[new] if freq is not None else np.zeros(new.size, dtype=np.float32)
            d.last[nl] = last[new] if last is not None else np.full(new.size, train_steps, dtype=np.int64)
            self.moves.store_away(nl[home], rec[new[home]])

    def _place(self, lids: np.ndarray, slots: np.ndarray, rec: np.ndarray) -> None:
        """Put new rows ``lids`` (away from every tier) into free fast-tier ``slots`` with records [n, W]."""
        if lids.size == 0:
            return
        self.fast.scatter(slots, rec)
        self.index.cslot[lids] = slots
        self.fast.slot_lid[slots] = lids
        self.fast.dirty[slots] = True  # no copy in a slower tier
        self.fast.keep[slots] = 0  # (their pins are as the checkpoint had them: load_table_meta)
        self.fast.restack(self._saved_free)  # the saved stack, below it the slots kept for rows still to load
