"""TierStore: records of one layout, keyed by (key space, id), in a bounded fast tier over host DRAM and disk.

A :class:`TierStore` holds records of one :class:`~tierec.embedding.layout.RecordLayout`
(weights, then optimizer state) keyed by (key space, id) in the tiers. A
:class:`~tierec.store.tiered_group.TieredGroup` is the TierStore of a table group's rows
(``RecordLayout.of_tables``) that also trains them (``update``, ``pool``) and
implements :class:`~tierec.embedding.storage.RowStorage`. A tiered chunk pool
(tierec/prune/tiered_pool.py) holds a TierStore of chunk records
(``RecordLayout.chunks``), with no table behind it.

A TierStore is made of a :class:`~tierec.store.directory.Directory` (where each row lives),
a :class:`~tierec.store.fast_tier.FastTier` (the cached rows and their slots), a
:class:`~tierec.store.host.HostTier` and a :class:`~tierec.store.disk.DiskTier`
below it, a :class:`~tierec.store.codec.RowCodec` for their records, and two
policies: :class:`~tierec.store.admission.Admission` (which new ids get a row)
and :class:`~tierec.store.eviction.Eviction` (which rows leave the fast tier);
it moves rows between them. Two more parts work on the same
tiers: the periodic hotness pass (:class:`~tierec.store.policies.HotnessPass`)
and the checkpoint records (:class:`~tierec.store.state.TierRecords`). The
store builds both in its constructor, gives each the parts it works on and the
few row moves it needs (a :class:`~tierec.store.moves.TierMoves`), and its
public methods (``maintain``, ``records``, ``write_records``, ...) delegate to
them under its lock.

The fast tier is a cache of ``capacity`` slots (GPU memory when the group's
device is a GPU, else a compact DRAM cache); the engine's kernels read and
update it exactly as they read a plain group's table (its ``weights`` and
``state`` are the fast tier's, and the two groups share the whole-row helpers
of tierec/embedding/group.py), because ``lookup`` returns cache slots. Behind it every row has one home: host DRAM (a
:class:`HostTier`, exclusive: a host row moves up and frees its slot) or disk
(a :class:`DiskTier`, inclusive: the disk copy stays valid until the cached
copy is written to). ``lookup`` brings a batch's missing rows up and evicts
cold unpinned rows, writing back weights and optimizer state together.
Host and disk hold rows as ``store.cold_precision`` says (a
:class:`~tierec.store.codec.RowCodec`: fp32, bf16 or int8 words); a row is
encoded when it leaves the fast tier and decoded when it comes back.

Pinning: a slot used by lookup number ``c`` carries ``pin = c`` and cannot be
evicted until lookup ``c + 1`` starts (the batch's update is done by then), or
``c + 2`` in a lookup that runs during the previous batch's step
(:meth:`TierStore.lookup_ahead`, ``store.lookup_ahead``). With a lossy cold
codec, where the numbers depend on which rows move, every lookup keeps the
``c + 2`` rule when the key is on, so looking ahead or not moves the same rows.
Every row has a single resident copy and the update always lands on it:
training is bitwise the same under any layout.

Reading ahead (:meth:`TierStore.stage`): the pipeline names the rows of
upcoming batches; those that live only on disk are read on the disk tier's
read-ahead threads into a :class:`~tierec.store.staging.Staging` window, and
a lookup takes a row's record from there when it is still current. Nothing
else changes, so the numbers do not depend on it.

Slot 0 is a shared row of zeros: ids not admitted yet (``admit_after``,
``admit_probability``) read it in training and get no update.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import torch
from torch import Tensor

from tierec.config import ColdPrecision
from tierec.embedding.changes import ChangeTracker
from tierec.embedding.group import init_dense_rows
from tierec.embedding.layout import RecordLayout
from tierec.store.admission import Admission
from tierec.store.codec import row_codec
from tierec.store.directory import LOC_DISK, LOC_HOST, LOC_NONE, Directory
from tierec.store.disk import DiskTier
from tierec.store.disk_rows import DiskRows
from tierec.store.eviction import Eviction
from tierec.store.fast_tier import ZERO_SLOT, FastTier
from tierec.store.horizon import Horizon
from tierec.store.host import HostTier
from tierec.store.moves import TierMoves, weakly
from tierec.store.policies import HotnessPass
from tierec.store.rowcopy import gather_rows
from tierec.store.sorted_search import distinct_order
from tierec.store.staging import BatchIds, Found, Resolved, Staging, WindowIds
from tierec.store.state import Clocks, TierRecords
from tierec.sizes import format_size
from tierec.store.spec import Counter, TierSpec

# A lookup that has to evict leaves room for the next lookups too (rows up to this share of the fast tier, beyond
# its own shortfall) where its misses need at most half of that: an eviction pass costs about the same whatever it
# evicts (it scans every slot's score, walks the host's demotion queue, starts a compaction share), so at 4x with
# a horizon every fourth or fifth lookup evicts instead of each (the lookup thread's CPU 16.6 -> 11.1 ms a step,
# int8; 14.8 -> 11.6, fp32) for 4% more disk rows; at 16x a lookup's misses outgrow the share and nothing changes.
EVICT_AHEAD = 1 / 12
# else: the rows an eviction makes room for beyond the shortfall, a share of the fast tier
EVICT_SLACK = 1 / 128


class CacheCapacityError(RuntimeError):
    """The fast tier cannot hold all rows of one batch at once."""


class StoreFullError(RuntimeError):
    """Rows must leave the fast tier but no slower tier has room."""


class TierStore:
    """The tiers of one store of records (``layout``), keyed by (key space, id); see the module's docstring."""

    def __init__(self, layout: RecordLayout, spec: TierSpec, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.layout = layout
        self.dim = layout.dim
        self.seed = seed  # of new rows' values, and of the cold codec's rounding
        self.device = torch.device(device)
        self.changes = ChangeTracker(layout.n_spaces)  # rows changed since the last publication, once started
        self.spec = spec
        self.record_width = layout.width  # float32 per row
        self.capacity = spec.cache_bytes // (4 * self.record_width)  # rows in the fast tier
        if self.capacity < 1:
            raise CacheCapacityError(
                f"the fast tier of {format_size(spec.cache_bytes)} ({spec.cache_key}) holds no row of {4 * self.record_width} bytes"
            )
        # rows of the last in_flight lookups stay pinned: with a lossy cold codec the same rule in every lookup,
        # so a lookup run ahead moves the rows the sequential one would (the numbers depend on them); else 1,
        # and 2 only in a lookup run ahead (lookup_ahead), where the batch before it is still computing
        lossy = spec.cold_precision is not ColdPrecision.FP32
        self.fast = FastTier(self.capacity, layout, self.device, spec.in_flight if lossy else 1)
        self._in_flight: int | None = None  # the rule of the lookup running now, when not the fast tier's
        self.index = Directory(n_tables=layout.n_spaces, cache_slots=self.capacity + 1, track_last=spec.ttl_steps > 0)
        # Host and disk hold records encoded by the codec (spec.cold_precision): codec.words 4-byte words each.
        self.codec = row_codec(spec.cold_precision, self.dim, list(self.fast.state_widths.values()), seed)
        host_rows = None if spec.host_bytes is None else spec.host_bytes // (4 * self.codec.words)
        self.host = HostTier(self.codec.words, host_rows) if host_rows != 0 else None
        self.disk = (
            DiskTier(
                spec.disk_dir,
                self.codec.words,
                io_threads=spec.io_threads,
                io_engine=spec.io_engine,
                drop_cache=spec.drop_page_cache,
                segment_rows=spec.disk_segment_rows,
                max_ratio=spec.disk_max_ratio,
            )
            if spec.disk_dir
            else None
        )
        self.admission = Admission(spec, seed)  # which new ids get a row
        # when rows are next used, from the ids of upcoming batches; kept independent of when batches were
        # foreseen only where placement changes numbers (a lossy cold codec: resume and every path agree)
        self.horizon = Horizon(spec.horizon, exact=lossy)
        self.eviction = Eviction(spec.cache_policy, self.horizon)  # which rows leave the fast tier
        self.counters = np.zeros((layout.n_spaces, len(Counter)), dtype=np.int64)  # [n_tables, n_counters]
        self.clock = 0  # lookups so far (training and evaluation)
        self.train_steps = 0  # training lookups so far: the clock of the hotness statistics
        self.max_batch_rows = 0  # most unique rows one training lookup needed
        self._last_rows = 0  # unique rows of the last lookup (pinned while the next one runs ahead)
        self._appended_seen = 0  # the disk tier's appended_rows at the last lookup's compaction
        self._lock = threading.RLock()
        self.staging = Staging()  # disk records of upcoming batches, read ahead (stage())
        # where a lookup's disk rows come from: the windows' records, its own read early, the rest on demand
        self.disk_rows = DiskRows(self.disk, self.staging) if self.disk is not None else None
        # seconds: in lookup, of which waiting for the lock (held by another thread), in stage()
        self.timers = {"lookup_s": 0.0, "lock_wait_s": 0.0, "prefetch_s": 0.0}
        # The row moves the hotness pass and the checkpoint records use (held weakly: no reference cycle).
        moves = TierMoves(
            take_slots=weakly(self._take_slots),
            bring_up=weakly(self._bring_up),
            free_rows=weakly(self.free_rows),
            read_rows=weakly(self.read_rows),
            store_away=weakly(self._store_away),
            count=weakly(self._count),
            note=self.changes.changed,
            note_deleted=self.changes.deleted,
            rehome=weakly(self._rehome),
        )
        self.hotness = HotnessPass(self.index, spec, self.fast, self.host, self.disk, moves, self.horizon)
        self.tier_records = TierRecords(
            self.index, self.fast, self.codec, self.host, self.disk, self.admission, self.counters, moves
        )

    # ------------------------------------------------------------ rows

    @property
    def weights(self) -> Tensor:  # [capacity + 1, D]: the fast tier's, what the kernels read and update
        return self.fast.weights

    @property
    def state(self) -> dict[str, Tensor]:  # the fast tier's optimizer state, by name
        return self.fast.state

    @property
    def num_rows(self) -> int:
        return self.index.num_rows

    def rows_per_table(self) -> np.ndarray:  # [n_tables]
        return self.index.rows_per_table(self.layout.n_spaces)

    def bytes_per_row(self) -> int:  # bytes of weights plus optimizer state for one row
        return 4 * self.record_width

    def _init_rows(self, slots: np.ndarray, keys: np.ndarray, tabs: np.ndarray) -> None:
        """New rows in fast-tier ``slots``: the values a plain group would give them (zeros without scales)."""
        init_dense_rows(self.weights, self.state, self.layout, self.seed, slots, keys, tabs)
        self.changes.changed(keys, tabs)

    # ------------------------------------------------------------ lookups

    find_rows = None  # lookup() moves rows between tiers: no read-only probe ahead of it

    def lookup(self, keys: np.ndarray, tabs: np.ndarray, insert: bool, known: Resolved | None = None) -> Tensor:
        """Fast-tier slots [U] of unique (table, key) pairs, all resident together until the next lookup.

        Training (``insert``): unknown ids are admitted (or read the zero slot)
        and access statistics are counted. Evaluation: unknown ids get -1.
        ``known``: these pairs as :meth:`resolve` gave them (their lids from a read-ahead window's probe).
        """
        t0 = time.perf_counter()
        with self._lock:
            t1 = time.perf_counter()
            try:
                return self._lookup(keys, tabs, insert, known)
            finally:
                self.timers["lock_wait_s"] += t1 - t0
                self.timers["lookup_s"] += time.perf_counter() - t0

    def _lookup(self, keys: np.ndarray, tabs: np.ndarray, insert: bool, known: Resolved | None = None) -> Tensor:
        self.clock += 1
        if insert:
            self.train_steps += 1
            self.horizon.advance(self.train_steps)
            if self.train_steps % self.spec.interval == 0:
                self.maintain()
            elif self.disk is not None:
                self._compact_some()
        d = self.index
        if known is not None:  # from the window's probe (all of them again if a row was deleted since)
            lids, cs, loc, home = d.probe_known(keys, tabs, known.lids, known.deletions)
        else:
            lids, cs, loc, home = d.probe(keys, tabs)  # [U] each
        rows = np.full(keys.shape[0], -1, dtype=np.int64)
        if insert:
            unknown = np.flatnonzero(lids < 0)
            if unknown.size:
                admit = self.admission.admit(keys[unknown], tabs[unknown], self.train_steps)
                rejected = unknown[~admit]
                rows[rejected] = ZERO_SLOT
                self._count(Counter.REJECTED, tabs[rejected])
                new = unknown[admit]
                lids[new] = d.insert(keys[new], tabs[new])  # away from every tier: cs and loc say so already
                if self.horizon.active:  # their uses in the batches foreseen before they had a row
                    self.horizon.resolve(keys[new], tabs[new], lids[new], self.train_steps)
                self._count(Counter.NEW, tabs[new])
        pos = np.flatnonzero(lids >= 0)
        rows[pos] = self._make_resident(lids[pos], cs[pos], loc[pos], home[pos], tabs[pos], self.clock)
        if insert:  # counted once resident: the exact counts of the fast tier (the batch's rows are pinned)
            d.count_use(rows[pos], self.train_steps)
            self.fast.dirty[rows[pos]] = True  # the backward updates them
            if self.horizon.active:  # their next uses, for eviction to read beside the slots
                self.fast.note_uses(rows[pos], lids[pos], self.horizon.next_at)
            self.max_batch_rows = max(self.max_batch_rows, int(pos.size))
            if known is not None and known.batch is not None:  # its window may go once all its batches did
                known.batch.looked_up = True
        self._last_rows = int(keys.shape[0])
        return torch.from_numpy(rows)

    def _rehome(self, lids: np.ndarray, slots: np.ndarray, since: float) -> None:
        """Rows' records moved within the disk tier (compaction, begun at ``since``): the windows' copies follow."""
        self.staging.rehome(lids, slots, self.disk.epochs(slots), since)

    def _compact_some(self) -> None:
        """A share of the disk tier's compaction, before this lookup probes (homes move): at most twice the
        records appended since the last lookup, so the file stays near its bound between hotness passes and a
        pass has little left (it moved about 870k records in 300 ms at 4x fp32, once every 100 steps, on the
        step's thread; here the lookup ahead does it)."""
        fresh = self.disk.appended_rows - self._appended_seen
        self._appended_seen = self.disk.appended_rows
        if fresh > 0:
            self.hotness.compact(most=2 * fresh)

    def lookup_ahead(self, keys: np.ndarray, tabs: np.ndarray, known: Resolved | None = None) -> Tensor | None:
        """The training lookup of the batch after the one whose step is computing, run during that step (the
        training pipeline's stage 3), or None when it has to wait for the step: a hotness pass is due at
        it (the pass may delete rows, the computing batch's among them). Safe beside the step: the
        computing batch's rows stay pinned (``spec.in_flight`` = 2; else this returns None, as it does when
        the two batches' rows might not fit in the fast tier together) and the step writes only them; the
        rows and numbers are those of :meth:`lookup` after the step."""
        with self._lock:
            if self.spec.in_flight < 2 or (self.train_steps + 1) % self.spec.interval == 0:
                return None
            if self._last_rows + keys.shape[0] > self.capacity:  # both batches' rows might not fit together
                return None
            self._in_flight = 2
            try:
                return self.lookup(keys, tabs, insert=True, known=known)
            finally:
                self._in_flight = None

    def resolve(self, keys: np.ndarray, tabs: np.ndarray) -> Resolved | None:
        """A batch's ids (``keys``/``tabs``, all of them, in the order a read-ahead window staged them) as unique
        pairs in first-seen order, with the lids the window's probe found, for :meth:`lookup`'s ``known``;
        None when no window holds the batch (then dedupe and probe as usual)."""
        with self._lock:
            return self.staging.resolve(keys, tabs)

    def stage(
        self, keys: np.ndarray, tabs: np.ndarray, next_use: np.ndarray | None = None,
        batches: list[BatchIds] | None = None, found: Found | None = None,
    ) -> int | None:
        """Start reading ahead the disk records of unique (table, id) pairs an upcoming window of batches
        needs; returns a token for :meth:`release_staged` (None when nothing had to be read nor kept).
        ``batches``: the window's batches, each's ids as its lookup will give them and their positions among
        ``keys``: the window keeps them with the lids probed here, for :meth:`resolve`. ``found``: the lids of
        ``keys`` as :meth:`foresee` found them: only pairs without one then are probed again, while no row was
        deleted since.

        Only rows that live on disk and are not in the fast tier (nor staged already) are read, on the
        disk tier's read-ahead threads; this returns at once. ``next_use`` [U]: for each pair, how many
        lookups from now the window last needs it (1 = the next lookup). With fp32 cold rows the fast
        tier then keeps those rows, and the rows read ahead once they come up, until that lookup unless
        a lookup needs their slots (eviction by next use inside the window, the hotness outside it);
        with a lossy codec placement changes numbers, so the window only reads ahead.
        """
        if self.disk is None:
            return None
        t0 = time.perf_counter()
        with self._lock:
            try:
                d = self.index
                lids = d.find(keys, tabs) if found is None else d.known_lids(keys, tabs, found.lids, found.deletions)
                ids = None if batches is None else WindowIds(keys, tabs, lids, d.deletions, batches)
                on_disk, home, in_fast, cs = d.split_known(lids)
                until = None
                if next_use is not None and not self.codec.lossy:
                    self.fast.keep_until(cs, self.clock + next_use[in_fast].astype(np.int64))
                    until = self.clock + next_use[on_disk].astype(np.int64)
                lids = lids[on_disk]
                fresh = self.staging.not_staged(lids)
                lids, home, until = lids[fresh], home[fresh], (until[fresh] if until is not None else None)
                if self.spec.stage_bytes is not None:  # the earliest batches' rows first (keys come in batch order)
                    n = self.staging.room(self.spec.stage_bytes, 4 * self.disk.rec_floats, lids.size)
                    lids, home, until = lids[:n], home[:n], (until[:n] if until is not None else None)
                order = distinct_order(lids)  # the pairs are unique: so are their rows
                lids, slots = lids[order], home[order]
                until = until[order] if until is not None else np.full(lids.size, -1, dtype=np.int64)
                if lids.size == 0 and ids is None:
                    return None
                return self.staging.add(lids, slots, self.disk.epochs(slots), self.disk.submit_read(slots), until, ids)
            finally:
                self.timers["prefetch_s"] += time.perf_counter() - t0

    def foresee(self, keys: np.ndarray, tabs: np.ndarray) -> Found | None:
        """The unique (table, id) pairs of the training batch after the last one foreseen (the first: the next
        lookup's): eviction ranks rows by their next use in the ``spec.horizon`` batches ahead
        (tierec/store/horizon.py); pairs without a row count from the lookup that makes it. Reads nothing;
        returns the lids found (for the window's :meth:`stage`), None without a horizon.

        The pairs are probed beside a lookup running on another thread (``Directory.find_beside``), and only
        the few pairs still without a row then are probed again under the store's lock, or all of them where
        rows were deleted meanwhile: the same lids as a probe under the lock, so the same ranking."""
        if not self.horizon.length:
            return None
        tabs = tabs.astype(np.int32, copy=False)
        lids, deletions = self.index.find_beside(keys, tabs)
        with self._lock:
            d = self.index
            # the pairs without a row then may have one now (the horizon links a pair's uses once it has a row)
            lids = d.known_lids(keys, tabs, lids, deletions)
            self.horizon.foresee(keys, tabs, lids, step=self.train_steps)
            return Found(lids, d.deletions)

    def release_staged(self, token: int | None = None) -> None:
        """Drop a window of records read ahead (all of them without a token: the pipeline stopped, and the
        horizon's batches go too)."""
        with self._lock:
            if token is None:
                self.staging.clear()
                self.horizon.clear()
                self.fast.forget_uses()
            else:
                self.staging.release(token)

    def release_looked_up(self, token: int) -> bool:
        """Drop window ``token`` if each of its batches was looked up from it (:meth:`resolve`, then the
        lookup); True if it was. Waits for a lookup running on another thread."""
        with self._lock:
            if not self.staging.looked_up(token):
                return False
            self.staging.release(token)
            return True

    def prefetcher(self) -> TierStore | None:
        # host rows are a copy away: nothing to read ahead or foresee; nor with no memory left to read ahead
        # and no horizon
        return self if self.disk is not None and (self.spec.stage_bytes != 0 or self.spec.horizon) else None

    def read_ahead_fill(self) -> tuple[int, int, int | None]:
        """(rows not read ahead so far for want of room, bytes the windows hold now, bytes they may hold; None:
        no bound)."""
        return self.staging.stats.dropped_rows, self.staging.nbytes(), self.spec.stage_bytes

    def tier_stores(self) -> list[TierStore]:
        return [self]

    # ---------------------------------------------------- data movement

    def _make_resident(
        self, lids: np.ndarray, cs: np.ndarray, loc: np.ndarray, home: np.ndarray, tabs: np.ndarray, pin: int
    ) -> np.ndarray:
        """Slots [n] of rows ``lids`` (of tables ``tabs``; fast-tier slot ``cs`` and home ``loc``/``home`` as
        probed) after bringing the missing ones up; all pinned with ``pin``."""
        cs = cs.copy()
        hit = cs >= 0
        self.fast.pin[cs[hit]] = pin  # protect them before anything is evicted
        miss = np.flatnonzero(~hit)
        self._count(Counter.HITS, tabs[hit])
        self._count(Counter.MISSES, tabs[miss][loc[miss] != LOC_NONE])
        if lids.size > self.capacity:
            raise CacheCapacityError(
                f"a batch needs {lids.size} rows of tables {list(self.layout.names)} resident together, but "
                f"the fast tier holds {self.capacity} ({format_size(self.spec.cache_bytes)}): raise {self.spec.cache_key} "
                f"to at least {format_size(lids.size * 4 * self.record_width)} or lower the batch size"
            )
        if miss.size:
            up, loc, home = lids[miss], loc[miss], home[miss].astype(np.int64, copy=False)
            early = self.disk_rows.start(up, loc, home) if self.disk_rows is not None else None  # while it evicts
            try:
                lifted = self._lift_from_host(up, loc, home)  # their host slots take rows the evictions below send down
                try:
                    slots = self._take_slots(miss.size, ahead=True)
                except BaseException:
                    if lifted is not None:  # nothing was evicted: back where they were
                        self._store_away(up[loc == LOC_HOST], lifted)
                    raise
                self._bring_up(up, slots, loc, home, lifted)
            finally:
                if early is not None:
                    self.disk_rows.finish(early)
            self.fast.pin[slots] = pin
            cs[miss] = slots
        return cs

    def _lift_from_host(self, lids: np.ndarray, loc: np.ndarray, home: np.ndarray) -> np.ndarray | None:
        """Records [n, W] of the rows ``lids`` homed on the host (``loc``/``home`` as probed; n of them), read and
        their host slots freed, the directory saying they are in no tier until :meth:`_bring_up` puts them in
        the fast tier; None when none is on the host. So the rows the evictions send down may take those slots,
        and no demotion moves a row this lookup brings up."""
        on_host = np.flatnonzero(loc == LOC_HOST)
        if on_host.size == 0:
            return None
        hs = home[on_host]
        records = self.codec.decode(self.host.read(hs))
        self.host.free(hs)
        moving = lids[on_host]
        self.index.loc[moving] = LOC_NONE
        self.index.home[moving] = -1
        return records

    def _take_slots(self, n: int, best_effort: bool = False, ahead: bool = False) -> np.ndarray:
        """``n`` free slots, evicting cold unpinned rows (with write-back) when needed; ``ahead``: for a lookup,
        whose eviction also makes room for the next lookups' rows where they are few (``EVICT_AHEAD``)."""
        short = n - self.fast.n_free
        if short > 0:
            room = int(self.capacity * EVICT_AHEAD)
            slack = room if ahead and 2 * n <= room else max(int(self.capacity * EVICT_SLACK), 1)
            self._evict(short, short + slack, best_effort)
        return self.fast.take(n)

    def _evict(self, required: int, wanted: int, best_effort: bool) -> None:
        slots, movable = self.eviction.choose(self.fast, self.index, self.clock, wanted, required, self._in_flight,
                                              self.train_steps)
        if movable < required and not best_effort:
            pinned = int(np.count_nonzero(self.fast.slot_lid[1:] >= 0)) - movable
            raise CacheCapacityError(
                f"the fast tier of tables {list(self.layout.names)} holds {self.capacity} rows; a lookup needs "
                f"{required} more while {pinned} are pinned by batches in flight: raise {self.spec.cache_key} "
                f"(now {format_size(self.spec.cache_bytes)}) or lower the batch size"
                + (" (or set store.lookup_ahead = false: then one batch's rows are pinned, not two)" if self.fast.in_flight > 1 else "")
            )
        self._write_back(slots)

    def _write_back(self, slots: np.ndarray) -> None:
        """Move rows out of the fast tier; rows changed or without a home are written first."""
        if slots.size == 0:
            return
        d = self.index
        lids = self.fast.slot_lid[slots].astype(np.int64)
        loc, home, freq = d.resident(slots)
        write = self.fast.dirty[slots] | (loc == LOC_NONE)
        if write.any():
            w = slots[write]
            loc[write], home[write] = self._store_home(lids[write], self.fast.gather(w), freq[write], loc[write], home[write])
        d.go_down(lids, slots, loc, home)
        self.fast.release(slots)
        self._count(Counter.EVICTED, d.tabs[lids])

    def _store_home(
        self, lids: np.ndarray, records: np.ndarray, freq: np.ndarray, loc: np.ndarray, home: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Write rows (records [n, W]; access counts ``freq``, current home ``loc``/``home``) to host (the
        hottest first, while it has room), the rest to disk; returns their new (home tier, home slot) [n].
        The caller records them in the directory."""
        d = self.index
        records = self.codec.encode(records, d.keys[lids], d.tabs[lids], self.clock)  # [n, words]
        old_slots = home[loc == LOC_DISK]
        new_loc, new_home = np.empty(lids.size, dtype=np.int8), np.empty(lids.size, dtype=np.int64)
        order = np.arange(lids.size)
        n_host = 0
        if self.horizon.active:  # rows the next batches use rank above the rest
            freq = self.horizon.ranked(freq, lids, self.train_steps)
        if self.host is not None:
            if self.disk is not None and self.host.free_rows is not None and self.host.free_rows < lids.size:
                self.hotness.demote_colder(freq, lids.size - self.host.free_rows, self.train_steps)
            free = self.host.free_rows
            n_host = lids.size if free is None else min(free, lids.size)
            if n_host < lids.size:  # hottest rows to host
                order = np.argsort(-freq, kind="stable")
                lids, records = lids[order], gather_rows(records, order)
            if n_host:
                hs = self.host.alloc(n_host)
                self.host.write(hs, records[:n_host])
                self.hotness.came_to_host(lids[:n_host], self.train_steps)
                new_loc[order[:n_host]], new_home[order[:n_host]] = LOC_HOST, hs
                self._count(Counter.HOST_WRITE_ROWS, d.tabs[lids[:n_host]])
        rest = lids[n_host:]
        if rest.size:
            if self.disk is None:
                raise StoreFullError(
                    f"tables {list(self.layout.names)} outgrew their memory budget "
                    f"(host tier full at {self.host.max_rows if self.host else 0} rows): "
                    "set store.disk_path, raise store.memory_budget, or bound the table with store.max_rows"
                )
            new_loc[order[n_host:]], new_home[order[n_host:]] = LOC_DISK, self.disk.append(rest, records[n_host:])
            self._count(Counter.DISK_WRITE_ROWS, d.tabs[rest])
        if self.disk is not None and old_slots.size:
            self.disk.free(old_slots)
        return new_loc, new_home

    def _store_away(self, lids: np.ndarray, records: np.ndarray) -> None:
        """Home rows away from every tier (records [n, W]) in host or disk (``_store_home``) and say so."""
        d = self.index
        none = np.zeros(lids.size, dtype=np.int8)
        loc, home = self._store_home(lids, records, d.freq[lids], none, np.full(lids.size, -1, dtype=np.int64))
        d.loc[lids] = loc
        d.home[lids] = home

    def _bring_up(self, lids: np.ndarray, slots: np.ndarray, loc: np.ndarray, home: np.ndarray,
                  lifted: np.ndarray | None = None) -> None:
        """Fill ``slots`` with rows ``lids`` (away from the fast tier, homed in ``loc``/``home``) from their
        homes (new rows are initialised); ``lifted``: the records of those homed on the host, already read and
        freed there (:meth:`_lift_from_host`)."""
        d = self.index
        new_loc, new_home = loc.copy(), home.copy()  # where a copy stays once they are up
        on_host = np.flatnonzero(loc == LOC_HOST)
        if on_host.size:
            if lifted is None:
                hs = home[on_host]
                lifted = self.codec.decode(self.host.read(hs))
                self.host.free(hs)
            self.fast.scatter(slots[on_host], lifted)
            new_loc[on_host], new_home[on_host] = LOC_NONE, -1  # the cache holds the only copy now
            self.fast.dirty[slots[on_host]] = True
            self._count(Counter.HOST_READ_ROWS, d.tabs[lids[on_host]])
        on_disk = np.flatnonzero(loc == LOC_DISK)
        if on_disk.size:
            payload, until, ahead = self.disk_rows.read(lids[on_disk], home[on_disk])
            self._count(Counter.PREFETCHED, d.tabs[lids[on_disk][ahead]])
            self.fast.scatter(slots[on_disk], self.codec.decode(payload))
            self.fast.keep[slots[on_disk]] = until  # rows read ahead for a later batch of the window too
            self.fast.dirty[slots[on_disk]] = False
            self._count(Counter.DISK_READ_ROWS, d.tabs[lids[on_disk]])
        new = np.flatnonzero(loc == LOC_NONE)
        if new.size:
            nl = lids[new]
            self._init_rows(slots[new], d.keys[nl], d.tabs[nl].astype(np.int32))
            self.fast.dirty[slots[new]] = True
        d.come_up(lids, slots, new_loc, new_home)
        self.fast.slot_lid[slots] = lids

    def _count(self, counter: Counter, tabs: np.ndarray) -> None:
        if tabs.size:
            self.counters[:, counter] += np.bincount(tabs, minlength=self.layout.n_spaces)

    # ------------------------------------------------------- row access

    def records_of(self, keys: np.ndarray, tabs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found [n], records [n, W]) of (table, id) pairs wherever they live (no movement, no statistics)."""
        with self._lock:
            lids = self.index.find(keys, tabs.astype(np.int32, copy=False))
            found = lids >= 0
            out = np.zeros((keys.shape[0], self.record_width), dtype=np.float32)
            if found.any():
                out[found] = self.read_rows(lids[found])
            return found, out

    def delete_records(self, keys: np.ndarray, tabs: np.ndarray) -> None:
        """Forget the rows of (table, id) pairs in every tier (unknown pairs are ignored)."""
        with self._lock:
            lids = self.index.find(keys, tabs.astype(np.int32, copy=False))
            lids = lids[lids >= 0]
            self.changes.deleted(self.index.keys[lids], self.index.tabs[lids])
            self.free_rows(lids)
            self.index.delete(lids)

    def _row_pairs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:  # a lookup ahead (another thread) may be growing the directory
            lids = self.fast.slot_lid[np.asarray(rows, dtype=np.int64)]  # rows are fast-tier slots
            return self.index.keys[lids], self.index.tabs[lids]

    def record_rows(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:
        """The rows (lids) :meth:`records` takes of known ``(table, id)`` pairs (-1: unknown); moves nothing."""
        with self._lock:
            return self.index.find(keys, tabs)

    def catch_up(self, t: int, sd: dict[str, Tensor]) -> None:
        """Decay every row's access count as the hotness passes between this group's clock and the
        delta's did (``store.clock`` in ``sd``); rows the delta carries get their counts from it."""
        if "store.clock" not in sd or self.spec.decay >= 1.0:
            return
        with self._lock:
            interval, to = self.spec.interval, int(sd["store.clock"][1])
            for _ in range(to // interval - self.train_steps // interval):
                self.index.decay(self.spec.decay)

    def read_rows(self, lids: np.ndarray) -> np.ndarray:
        """Records [n, W] of rows ``lids`` wherever they live (no movement between tiers)."""
        d = self.index
        out = np.empty((lids.size, self.record_width), dtype=np.float32)
        cs = d.cslot[lids]
        res = np.flatnonzero(cs >= 0)
        out[res] = self.fast.gather(cs[res].astype(np.int64))
        loc = d.loc[lids]
        h = np.flatnonzero((cs < 0) & (loc == LOC_HOST))
        out[h] = self.codec.decode(self.host.read(d.home[lids[h]])) if h.size else out[h]
        k = np.flatnonzero((cs < 0) & (loc == LOC_DISK))
        out[k] = self.codec.decode(self.disk.read(d.home[lids[k]], lids[k])) if k.size else out[k]
        return out

    def free_rows(self, lids: np.ndarray) -> None:
        """Release every tier's slot of rows ``lids`` (before the directory forgets them)."""
        d = self.index
        self.horizon.forget(lids, d.keys[lids], d.tabs[lids])
        cs = d.cslot[lids].astype(np.int64)
        cs = np.sort(cs[cs >= 0])  # freed in slot order, not lid order: a resumed run numbers lids anew
        self.fast.release(cs)
        loc = d.loc[lids]
        if self.host is not None:
            self.host.free(d.home[lids[loc == LOC_HOST]])
        if self.disk is not None:
            self.disk.free(d.home[lids[loc == LOC_DISK]])

    # ------------------------------------------------ hotness pass (policies.py)

    def maintain(self) -> None:
        """The hotness pass (tierec/store/policies.py); a training lookup runs it every ``spec.interval`` steps."""
        self.hotness.maintain(self.clock, self.train_steps)

    def delete_rows(self, lids: np.ndarray, counter: Counter) -> None:
        """Forget rows ``lids`` in every tier, counted under ``counter``."""
        self.hotness.delete_rows(lids, counter)

    def place_by_hotness(self) -> None:
        """After a checkpoint's rows were loaded: the hottest rows away from the fast tier to host, the rest to
        disk (:meth:`HotnessPass.place_by_hotness`)."""
        with self._lock:
            self.hotness.place_by_hotness()

    # ------------------------------------------- checkpoint records (state.py)

    def row_extent(self) -> int:
        return self.tier_records.row_extent()

    def rows_of(self, t: int, lo: int, hi: int) -> np.ndarray:
        return self.tier_records.rows_of(t, lo, hi)

    def records(self, t: int, rows: np.ndarray) -> dict[str, Tensor]:
        """Records of rows (lids) ``rows`` from whichever tier holds them, with ``store.freq`` / ``store.last``."""
        with self._lock:
            return self.tier_records.records(t, rows)

    def table_meta(self, t: int) -> dict[str, Tensor]:
        with self._lock:
            return self.tier_records.table_meta(t, Clocks(self.clock, self.train_steps, self.max_batch_rows))

    def load_table_meta(self, t: int, sd: dict[str, Tensor]) -> None:
        with self._lock:
            clocks = self.tier_records.load_table_meta(t, sd)
            if clocks is not None:
                self.clock, self.train_steps, self.max_batch_rows = clocks

    def write_records(self, t: int, sd: dict[str, Tensor]) -> None:
        """Insert or overwrite rows; they go to host, then disk (the fast tier warms up again), or with
        ``store.slot`` back into their fast-tier slots (tierec/store/state.py)."""
        with self._lock:
            self.tier_records.write_records(t, sd, self.train_steps)

    def put_records(self, keys: np.ndarray, tabs: np.ndarray, records: np.ndarray) -> None:
        """Overwrite (or insert) rows of (table, id) pairs with ``records`` [n, W]; known rows keep their
        access statistics (a move between ranks, e.g. a hot row handed back to its owner)."""
        with self._lock:
            self.tier_records.put_records(keys, tabs, records, self.train_steps)

    # ---------------------------------------------------------- reports

    def nbytes(self) -> int:
        """Bytes of RAM: fast tier, host rows, directory, sketch and disk bookkeeping."""
        total = self.fast.nbytes() + self.index.nbytes() + self.counters.nbytes
        if self.host is not None:
            total += self.host.nbytes()
        if self.disk is not None:
            total += self.disk.nbytes()
        total += self.admission.nbytes()
        total += self.disk_rows.nbytes() if self.disk_rows is not None else 0
        return total + self.staging.nbytes() + self.horizon.nbytes() + self.hotness.nbytes()

    def resident_nbytes(self) -> int:  # the tiers account for their own memory
        return self.nbytes()

    def disk_bytes(self) -> int:
        return self.disk.file_bytes() if self.disk is not None else 0

    def stats(self) -> dict[str, dict[str, float]]:
        """Per table: event counters, rows per tier, hit rate and disk bytes (cumulative)."""
        with self._lock:
            d = self.index
            n_t = self.layout.n_spaces
            occupied = self.fast.slot_lid[self.fast.slot_lid >= 0]
            in_cache = np.bincount(d.tabs[occupied], minlength=n_t)
            by_loc = d.rows_by_loc(n_t)
            on_host, on_disk = by_loc[LOC_HOST], by_loc[LOC_DISK]
            rec_bytes = self.disk.rec_bytes if self.disk is not None else 4 * self.record_width
            out = {}
            for t, name in enumerate(self.layout.names):
                c = {k.name.lower(): int(self.counters[t, k]) for k in Counter}
                looked = c["hits"] + c["misses"] + c["new"]
                c["hit_rate"] = c["hits"] / looked if looked else float("nan")
                c["rows_cache"], c["rows_host"], c["rows_disk"] = int(in_cache[t]), int(on_host[t]), int(on_disk[t])
                c["disk_read_bytes"] = c["disk_read_rows"] * rec_bytes
                c["disk_write_bytes"] = c["disk_write_rows"] * rec_bytes
                out[name] = c
            return out

    # ------------------------------------------------------------ state

    def close(self) -> None:
        """Close the disk tier's file (it was unlinked when opened)."""
        self.staging.clear()
        if self.disk is not None:
            self.disk.close()
