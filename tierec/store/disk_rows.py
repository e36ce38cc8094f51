"""DiskRows: where a lookup's rows homed on disk come from.

Three sources, in this order: the records a read-ahead window read for the
batch (``staging``: TierStore.stage), those the lookup itself started reading
before it evicted (``early``: :meth:`DiskRows.start`), and the rest read on
demand. A copy is taken only while it is the row's current record (same slot,
same segment epoch: DiskTier.epochs); the header of each record must name its row.

Why the lookup's own early reads: at 4x fp32 with a horizon about 260 rows of
6,910 a lookup were read on demand, mostly rows whose records compaction had
moved after a window read them, and the lookup waited about 4 ms for them.
Started before its evictions (several ms of CPU), they are read by then. Since
windows follow compaction's moves (``Staging.rehome``) there are fewer: 97 of
6,071 a lookup there (166 before), 271 of 6,693 at 4x int8 (413).
"""

from __future__ import annotations

import numpy as np

from tierec.store.directory import LOC_DISK
from tierec.store.disk import DiskTier
from tierec.store.sorted_search import distinct_order
from tierec.store.staging import Staging


class DiskRows:
    def __init__(self, disk: DiskTier, staging: Staging) -> None:
        self.disk = disk
        self.staging = staging  # the read-ahead windows' records (the store's)
        self.early = Staging()  # the running lookup's own, read while it evicts

    def nbytes(self) -> int:  # the early reads' (the windows' are the store's to count)
        return self.early.nbytes()

    def start(self, lids: np.ndarray, loc: np.ndarray, home: np.ndarray) -> int | None:
        """Start reading, on the disk tier's read-ahead threads, the records of the rows ``lids`` homed on disk
        (``loc``/``home`` as probed) of which no window holds the current one; returns the token for
        :meth:`finish`, None when there is nothing to read. The rows must stay on disk until :meth:`read`."""
        on_disk = np.flatnonzero(loc == LOC_DISK)
        if on_disk.size == 0:
            return None
        lids, homes = lids[on_disk].astype(np.int64, copy=False), home[on_disk].astype(np.int64, copy=False)
        epochs = self.disk.epochs(homes)
        fresh = ~self.staging.current(lids, homes, epochs)
        if not fresh.any():
            return None
        order = np.flatnonzero(fresh)[distinct_order(lids[fresh])]  # rows brought up: each once
        lids, homes = lids[order], homes[order]
        not_kept = np.full(lids.size, -1, dtype=np.int64)
        return self.early.add(lids, homes, epochs[order], self.disk.submit_read(homes), not_kept)

    def finish(self, token: int | None) -> None:
        """Drop what :meth:`start` read (taken or not)."""
        if token is not None:
            self.early.release(token)

    def read(self, lids: np.ndarray, homes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(payloads [n, words], keep-until [n], read ahead [n] bool) of rows ``lids`` from their disk slots
        ``homes``: a window's records where current (with the lookup the window needs them until), then the
        lookup's own early ones, the rest read now (keep-until -1 for both)."""
        homes = homes.astype(np.int64, copy=False)
        lids64, epochs = lids.astype(np.int64, copy=False), self.disk.epochs(homes)
        out = np.empty((lids.size, self.disk.width), dtype=np.float32)
        keep = np.full(lids.size, -1, dtype=np.int64)
        ahead, header = self.staging.take(lids64, homes, epochs, out, keep)
        found = ahead.copy()
        rest = np.flatnonzero(~found)
        if rest.size and self.early.held_rows:
            part = np.empty((rest.size, out.shape[1]), dtype=out.dtype)
            got, got_header = self.early.take(lids64[rest], homes[rest], epochs[rest], part, keep[rest])
            out[rest[got]], header[rest[got]], found[rest[got]] = part[got], got_header[got], True
        hit = np.flatnonzero(found)
        if hit.size == 0:
            return self.disk.read(homes, lids), keep, ahead
        self.disk.check_lids(homes[hit], header[hit], lids[hit])
        rest = np.flatnonzero(~found)
        if rest.size:
            out[rest] = self.disk.read(homes[rest], lids[rest])
        return out, keep, ahead
