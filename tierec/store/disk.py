"""DiskTier: fixed-size row records in a file on local disk, with a bounded RAM footprint.

A record is ``[lid | weights | optimizer state]`` (float32, the lid stored as
int32 bits) at byte ``slot * record_bytes``; the payload is ``width`` 4-byte
words, float32 values or a compact encoding's bits (tierec/store/codec.py). Writes are log-structured: rows
leaving the faster tiers are appended in one sequential write per batch, and
the old copy's slot is marked dead, so a write never costs the random
read-modify-write of a partly overwritten page. The file is cut into
segments; a segment with no live record is reused, and :meth:`compact`
rewrites the live records of the emptiest segments until the segments in use
hold at most ``max_ratio`` (1.25) slots per live record, so the file stays near
its live size however long the run (the lid in each record tells the caller
whose home moved). The caller compacts a little at every training lookup (at
most twice the records appended since the last call: ``appended_rows``) and
the rest at each hotness pass. Rows are rewritten at random,
so few segments empty by themselves: with a fixed number of segments moved per
pass the file kept growing (3.9x its live records after 1,200 steps of
``benchmarks.tiers --which disk``) and the read requests per step with it.

Reads go through an ``O_DIRECT`` descriptor, so they never enter the page
cache: each read is the aligned 512-byte span around its records, and records
less than 16 KiB apart share one read (fewer requests for a few more bytes).
They reach the device through Linux native AIO (tierec/store/aio.py: 64 in
flight from one thread, a batch per system call), or where the kernel refuses
it (``io_engine = "threads"``) as blocking ``pread`` calls from numba kernels
that release the GIL, on ``io_threads`` threads at once (the read plans and
kernels: tierec/store/disk_reads.py). Appends are
synced and their pages dropped (``POSIX_FADV_DONTNEED``) on a flush thread, off
the training step (a direct read of a range not yet synced writes it first).
So the kernel does not quietly keep the table in RAM, and disk reads in
benchmarks are real.
Where O_DIRECT is refused (tmpfs), reads are buffered, readahead is turned
off and each read's pages are dropped at once.

The file is unlinked as soon as it is opened: it disappears with the process.
Every read and write checks its byte count, the file's size is checked
against what was written before each batch of reads or writes, and every
record read must carry the row id it was written with (when the caller names
it): a file truncated or changed from outside (through ``/proc/PID/fd``) is a
one-line :class:`~tierec.errors.DiskTierError` naming the file, never rows of
zeros.

>>> import numpy as np, tempfile
>>> from tierec.store.disk import DiskTier
>>> d = DiskTier(tempfile.gettempdir(), width=2, segment_rows=4)
>>> slots = d.append(np.array([10, 11, 12]), np.arange(6, dtype=np.float32).reshape(3, 2))
>>> d.read(slots[::-1], lids=np.array([12, 11, 10])).tolist()
[[4.0, 5.0], [2.0, 3.0], [0.0, 1.0]]
>>> d.free(slots[:1]); d.live_rows
2
>>> d.close()
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

import numba as nb
import numpy as np

from tierec.errors import DiskFullError, DiskTierError, free_bytes, is_disk_full
from tierec.store.aio import AioContext, open_context
from tierec.store.disk_reads import (
    AIO_DEPTH,
    DIRECT_ALIGN,
    DIRECT_GAP,
    PAGE,
    read_runs_buffered,
    read_spans_aio,
    read_spans_blocking,
    runs,
    spans,
)
from tierec.store.sorted_search import distinct_order

IO_ENGINES = ("auto", "aio", "threads")


@nb.njit(cache=True, nogil=True)
def _set_live(bitmap: np.ndarray, first: int, n: int) -> None:
    """Set bits ``first .. first + n - 1`` of a uint8 bitmap (bit i: byte i // 8, bit i % 8); a loop: numpy's
    ``bitwise_or.at`` took 5% of a training lookup at 4x."""
    for i in range(first, first + n):
        bitmap[i >> 3] |= np.uint8(1 << (i & 7))


@nb.njit(cache=True, nogil=True)
def _free_slots(bitmap: np.ndarray, seg_live: np.ndarray, slots: np.ndarray, seg_rows: int, emptied: np.ndarray) -> int:
    """Clear the live bits of ``slots`` and take them off their segments' counts; the segments left with no
    live record go to ``emptied`` (in the order they emptied); returns how many."""
    n = 0
    for i in slots:
        bitmap[i >> 3] &= ~np.uint8(1 << (i & 7))
        s = i // seg_rows
        seg_live[s] -= 1
        if seg_live[s] == 0:
            emptied[n] = s
            n += 1
    return n


def _bits(bitmap: np.ndarray, idx: np.ndarray) -> np.ndarray:  # [n] bool
    return ((bitmap[idx >> 3] >> (idx & 7).astype(np.uint8)) & 1).astype(bool)


class _Handles:
    """What a disk tier holds of the kernel's: its two descriptors and its AIO contexts. :meth:`release` (from
    :meth:`DiskTier.close`, or a finalizer when the tier is collected unclosed) frees each once."""

    def __init__(self) -> None:
        self.fd = -1
        self.dfd = -1
        self.contexts: list[AioContext] = []  # the free ones (a read holds its own while it runs)

    def release(self) -> None:
        for ctx in self.contexts:
            ctx.close()
        self.contexts.clear()
        for name in ("fd", "dfd"):
            if getattr(self, name) >= 0:
                os.close(getattr(self, name))
                setattr(self, name, -1)


class DiskTier:
    def __init__(
        self,
        directory: str,
        width: int,
        *,
        io_threads: int = 8,
        drop_cache: bool = True,
        segment_rows: int = 1 << 16,
        max_ratio: float = 1.25,
        io_engine: str = "auto",
    ) -> None:
        if not max_ratio > 1.0:
            raise ValueError(f"a disk tier's max_ratio (slots per live record) must be above 1, got {max_ratio}")
        if io_engine not in IO_ENGINES:
            raise ValueError(f"a disk tier's io_engine must be one of {', '.join(IO_ENGINES)}, got {io_engine!r}")
        os.makedirs(directory, exist_ok=True)
        self._handles = _Handles()
        # a tier dropped without close() (a run's stores after Trainer.fit) gives its descriptors and contexts back
        self._release = weakref.finalize(self, self._handles.release)
        fd, path = tempfile.mkstemp(dir=directory, prefix="tierec-", suffix=".rows")
        # Reads bypass the page cache (O_DIRECT) when the file system allows it; writes are buffered.
        try:
            self.dfd = os.open(path, os.O_RDONLY | os.O_DIRECT) if drop_cache and hasattr(os, "O_DIRECT") else -1
        except OSError:  # e.g. tmpfs: fall back to dropping pages after each read
            self.dfd = -1
        os.unlink(path)
        self.fd = fd
        if drop_cache:  # the buffered fallback reads exactly the pages it needs
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        self.path = path
        self.width = width  # 4-byte words of payload per record
        self.rec_floats = width + 1  # plus the lid header
        self.rec_bytes = 4 * self.rec_floats
        self.io_threads = max(1, io_threads)
        self.drop_cache_after_io = drop_cache
        self.seg_rows = segment_rows
        self.max_ratio = max_ratio  # compact() keeps the segments in use at most this many slots per live record
        self.seg_live = np.zeros(0, dtype=np.int64)  # [n_seg] live records per segment
        self.seg_epoch = np.zeros(0, dtype=np.int64)  # [n_seg] times the segment was reused (see epochs())
        self.live = np.zeros(0, dtype=np.uint8)  # [n_seg * seg_rows / 8] bit s: slot s holds a live record
        self._free_segs: list[int] = []
        self._tail = -1  # segment being appended to
        self._tail_pos = 0
        self.live_rows = 0
        self.appended_rows = 0  # records appended by callers (compaction's own moves not counted)
        self.bytes_read = 0
        self.bytes_written = 0
        self.requests = 0  # read requests sent to the device (a request may serve several records)
        self.device_bytes = 0  # bytes those requests moved (aligned spans: more than the records they serve)
        self._requests_lock = threading.Lock()
        self._extent = 0  # bytes of the file written so far: it may not be shorter
        self._pool: ThreadPoolExecutor | None = None
        self._ahead_pool: ThreadPoolExecutor | None = None  # reads ahead (submit_read): never delay one on demand
        self._flush_pool: ThreadPoolExecutor | None = None  # writes back and drops written pages, off the step
        self._flushes: list[tuple[Future, int]] = []  # (flush, bytes it covers) not yet seen to succeed
        # O_DIRECT reads through native AIO (tierec/store/aio.py): one context per reading thread, kept for reuse
        self._aio_cond = threading.Condition()
        self._aio_free = self._handles.contexts
        self._aio_live = 0  # contexts open, free or in use
        self._aio_offered = False
        if io_engine != "threads" and self.dfd >= 0:
            ctx = open_context(AIO_DEPTH)
            if ctx is not None:
                self._aio_free.append(ctx)
                self._aio_live = 1
                self._aio_offered = True
            elif io_engine == "aio":
                self.close()
                raise DiskTierError(path, "store.io_engine is 'aio' but this system refuses native AIO (io_setup); "
                                          "set it to 'auto' or 'threads'")

    # ------------------------------------------------------------- sizes

    @property
    def fd(self) -> int:  # the file, buffered (writes; reads where O_DIRECT is refused)
        return self._handles.fd

    @fd.setter
    def fd(self, value: int) -> None:
        self._handles.fd = value

    @property
    def dfd(self) -> int:  # the same file through O_DIRECT (reads), or -1
        return self._handles.dfd

    @dfd.setter
    def dfd(self, value: int) -> None:
        self._handles.dfd = value

    @property
    def aio(self) -> bool:  # reads go through native AIO (O_DIRECT reads where the kernel offers it)
        return self._aio_offered and self.dfd >= 0

    @property
    def n_segments(self) -> int:
        return self.seg_live.shape[0]

    def file_bytes(self) -> int:
        return self.n_segments * self.seg_rows * self.rec_bytes

    def nbytes(self) -> int:  # bytes of RAM for bookkeeping
        return self.seg_live.nbytes + self.seg_epoch.nbytes + self.live.nbytes

    def epochs(self, slots: np.ndarray) -> np.ndarray:
        """[n] reuse count of each slot's segment. A live record's bytes never change while its segment's
        epoch stays the same (appends only write slots past the tail), so a record read ahead is still the
        record at that slot when (slot, epoch) still name the row's home."""
        return self.seg_epoch[np.asarray(slots, dtype=np.int64) // self.seg_rows]

    # ------------------------------------------------------------ writes

    def _next_segment(self) -> int:
        if self._free_segs:
            seg = self._free_segs.pop()
            self.seg_epoch[seg] += 1  # its slots will hold other records now
            return seg
        seg = self.n_segments
        self.seg_live = np.append(self.seg_live, 0)
        self.seg_epoch = np.append(self.seg_epoch, 0)
        need = -(-(seg + 1) * self.seg_rows // 8)
        if self.live.shape[0] < need:  # grow the bitmap by doubling, not per segment
            grown = np.zeros(max(need, 2 * self.live.shape[0]), dtype=np.uint8)
            grown[: self.live.shape[0]] = self.live
            self.live = grown
        return seg

    def append(self, lids: np.ndarray, records: np.ndarray) -> np.ndarray:
        """Write records [n, W] of rows ``lids`` at the log's tail; returns their slots [n]."""
        self.appended_rows += lids.shape[0]
        return self._append(lids, records)

    def _append(self, lids: np.ndarray, records: np.ndarray) -> np.ndarray:
        n = lids.shape[0]
        slots = np.empty(n, dtype=np.int64)
        if n == 0:
            return slots
        self._check_size()  # a write past a truncated end would leave a hole that reads as zeros
        buf = np.empty((n, self.rec_floats), dtype=np.float32)
        buf[:, 0] = lids.astype(np.int32).view(np.float32)
        buf[:, 1:] = records
        i = 0
        while i < n:
            if self._tail < 0 or self._tail_pos == self.seg_rows:
                if self._tail >= 0 and self.seg_live[self._tail] == 0:
                    self._free_segs.append(self._tail)  # emptied while it was the tail
                self._tail, self._tail_pos = self._next_segment(), 0
            k = min(self.seg_rows - self._tail_pos, n - i)
            first = self._tail * self.seg_rows + self._tail_pos
            slots[i : i + k] = np.arange(first, first + k)
            self._pwrite(buf[i : i + k], first * self.rec_bytes)
            _set_live(self.live, first, k)
            self.seg_live[self._tail] += k
            self._tail_pos += k
            i += k
        self.live_rows += n
        return slots

    def _pwrite(self, buf: np.ndarray, offset: int) -> None:
        view = memoryview(np.ascontiguousarray(buf)).cast("B")
        done = 0
        try:
            while done < len(view):
                wrote = os.pwrite(self.fd, view[done:], offset + done)
                if wrote <= 0:
                    raise DiskTierError(self.path, f"a write of {len(view):,} bytes at offset {offset:,} stopped after {done:,} bytes")
                done += wrote
        except OSError as e:
            self._io_failed(e, len(view) - done)
        self.bytes_written += len(view)
        self._extent = max(self._extent, offset + len(view))
        if self.drop_cache_after_io:  # written back, then dropped from the page cache, on the flush thread
            self._reap_flushes()
            if self._flush_pool is None:
                self._flush_pool = ThreadPoolExecutor(1, thread_name_prefix="tierec-disk-flush")
            lo = offset - offset % PAGE
            self._flushes.append((self._flush_pool.submit(self._flush, lo, offset + len(view) - lo), len(view)))

    def _flush(self, offset: int, length: int) -> None:
        """Write a written range to the device and drop its pages (a flush thread; reads never need it: an
        O_DIRECT read writes dirty pages of its range first, a buffered one reads them)."""
        os.fdatasync(self.fd)
        os.posix_fadvise(self.fd, offset, length, os.POSIX_FADV_DONTNEED)

    def _reap_flushes(self, wait: bool = False) -> None:
        """Forget finished flushes; a failed one fails here, as the write it flushed would have."""
        pending = []
        for fut, nbytes in self._flushes:
            if not (wait or fut.done()):
                pending.append((fut, nbytes))
                continue
            try:
                fut.result()
            except OSError as e:
                self._flushes = []
                self._io_failed(e, nbytes)
        self._flushes = pending

    def _io_failed(self, e: OSError, nbytes: int) -> None:
        """A full disk: one line naming the directory and the bytes (tierec.errors); anything else as it is."""
        if not is_disk_full(e):
            raise e
        where = os.path.dirname(self.path)
        hint = ("free space there or give another store.disk_path (--resume --set store.disk_path=DIR), "
                "then continue with --resume (the last complete checkpoint is intact)")
        raise DiskFullError(where, nbytes, free_bytes(where), what="the disk tier's rows in", hint=hint) from None

    def free(self, slots: np.ndarray) -> None:
        """Mark records dead; a segment left without live records is reused."""
        if slots.shape[0] == 0:
            return
        slots = np.asarray(slots, dtype=np.int64)
        emptied = np.empty(slots.shape[0], dtype=np.int64)
        n = _free_slots(self.live, self.seg_live, slots, self.seg_rows, emptied)
        self.live_rows -= slots.shape[0]
        for s in np.sort(emptied[:n]):
            if s != self._tail:
                self._free_segs.append(int(s))

    # ------------------------------------------------------------- reads

    def read(self, slots: np.ndarray, lids: np.ndarray | None = None) -> np.ndarray:
        """Payloads [n, W] of the records at ``slots`` (any order; duplicates allowed).

        With ``lids`` (the rows written there), each record's header must name its row.
        """
        full = self._read_full(slots)
        if lids is not None:
            self.check_lids(np.asarray(slots, dtype=np.int64), full[:, 0].copy().view(np.int32), np.asarray(lids))
        return full[:, 1:]

    def check_lids(self, slots: np.ndarray, got: np.ndarray, lids: np.ndarray) -> None:
        bad = np.flatnonzero(got != lids.astype(np.int32))
        if bad.size:
            i = int(bad[0])
            raise DiskTierError(self.path, f"{bad.size:,} record(s) read back are not the rows written there "
                                           f"(slot {int(slots[i]):,} holds row {int(got[i])}, row {int(lids[i])} was written): "
                                           "the file was changed outside tierec")

    def _check_size(self) -> None:
        """The file still holds every byte written to it (truncated from outside, a read would come back short or zero)."""
        size = os.fstat(self.fd).st_size
        if size < self._extent:
            raise DiskTierError(self.path, f"it holds {size:,} bytes where {self._extent:,} were written: "
                                           "it was truncated outside tierec")

    def _read_full(self, slots: np.ndarray) -> np.ndarray:  # [n, 1 + W] with the lid header
        slots = np.asarray(slots, dtype=np.int64)
        n = slots.shape[0]
        out = np.empty((n, self.rec_floats), dtype=np.float32)
        if n == 0:
            return out
        self._check_size()
        in_order = bool(np.all(slots[1:] > slots[:-1]))  # sorted, each once (compaction's): read into out itself
        if in_order:
            uniq, buf = slots, out
        else:
            order = np.argsort(slots, kind="stable")
            uniq, first = np.unique(slots[order], return_index=True)
            buf = np.empty((uniq.shape[0], self.rec_floats), dtype=np.float32)
        run_slot, run_len, run_dst = runs(uniq)
        chunks = self._split(run_len)
        status = self._map(lambda c: self._read_runs(run_slot[c], run_len[c], run_dst[c], buf), chunks)
        if min(status) < 0:
            self._check_size()  # truncated meanwhile: say so
        if min(status) < 0 and self.dfd >= 0:  # O_DIRECT refused at read time: buffered from now on
            os.close(self.dfd)
            self.dfd = -1
            status = self._map(lambda c: self._read_runs(run_slot[c], run_len[c], run_dst[c], buf), chunks)
        if min(status) < 0:
            self._check_size()
            raise DiskTierError(self.path, f"a read of {buf.nbytes:,} bytes ({uniq.shape[0]:,} records) came back short")
        self.bytes_read += buf.nbytes
        if not in_order:
            dup = np.repeat(np.arange(uniq.shape[0]), np.diff(np.append(first, n)))  # sorted pos -> unique row
            out[order] = buf[dup]
        return out

    def submit_read(self, slots: np.ndarray) -> PendingRead:
        """Start reading the records at ``slots`` (any order, unique) on the read-ahead threads; returns at once.

        The reads only fill a buffer of their own: nothing of this tier changes, so the caller decides
        later (:meth:`epochs`) which of the records are still current.
        """
        slots = np.asarray(slots, dtype=np.int64)
        order = distinct_order(slots)
        srt = slots[order]
        buf = np.empty((srt.shape[0], self.rec_floats), dtype=np.float32)
        pending = PendingRead(self, slots, order, buf)
        if srt.shape[0]:
            self._check_size()
            run_slot, run_len, run_dst = runs(srt)
            if self._ahead_pool is None:
                self._ahead_pool = ThreadPoolExecutor(self.io_threads, thread_name_prefix="tierec-disk-ahead")
            for c in self._split(run_len):
                pending.futures.append(self._ahead_pool.submit(pending.timed, self._read_runs, run_slot[c], run_len[c], run_dst[c], buf))
        return pending

    def _read_runs(self, run_slot: np.ndarray, run_len: np.ndarray, run_dst: np.ndarray, buf: np.ndarray) -> int:
        if self.dfd >= 0:
            span_lo, span_hi, span_run = spans(run_slot, run_len, self.rec_bytes, DIRECT_ALIGN, DIRECT_GAP)
            with self._requests_lock:
                self.requests += int(span_lo.shape[0])
                self.device_bytes += int((span_hi - span_lo).sum())
            if self.aio:
                return self._aio_read(span_lo, span_hi, span_run, run_slot, run_len, run_dst, buf)
            out_bytes = buf.reshape(-1).view(np.uint8)
            return read_spans_blocking(self.dfd, span_lo, span_hi, span_run, run_slot, run_len, run_dst, self.rec_bytes, out_bytes)
        with self._requests_lock:
            self.requests += int(run_slot.shape[0])
            self.device_bytes += int(run_len.sum()) * self.rec_bytes
        return read_runs_buffered(self.fd, run_slot, run_len, run_dst, self.rec_bytes, buf, self.drop_cache_after_io)

    def _aio_read(self, span_lo: np.ndarray, span_hi: np.ndarray, span_run: np.ndarray, run_slot: np.ndarray,
                  run_len: np.ndarray, run_dst: np.ndarray, buf: np.ndarray) -> int:
        """The spans read through a free AIO context (disk_reads.read_spans_aio); by blocking calls where none is
        left, or where the kernel refuses the reads (e.g. in a forked child): then the next ones on the threads."""
        out_bytes = buf.reshape(-1).view(np.uint8)
        args = (self.dfd, span_lo, span_hi, span_run, run_slot, run_len, run_dst, self.rec_bytes, out_bytes)
        ctx = self._take_context()
        if ctx is None:
            self._aio_offered = False
            return read_spans_blocking(*args)
        try:
            return read_spans_aio(ctx, self.dfd, span_lo, span_hi, run_slot, run_len, run_dst, self.rec_bytes, out_bytes)
        except OSError:
            self._aio_offered = False
            return read_spans_blocking(*args)
        finally:
            self._give_context(ctx)

    def _take_context(self) -> AioContext | None:
        """A free AIO context: one kept from an earlier read, a new one, or where the kernel opens no more
        (``fs.aio-max-nr``) the next one another thread's read gives back; None when none is open at all."""
        with self._aio_cond:
            while True:
                if self._aio_free:
                    return self._aio_free.pop()
                ctx = open_context(AIO_DEPTH)
                if ctx is not None:
                    self._aio_live += 1
                    return ctx
                if self._aio_live == 0:
                    return None
                self._aio_cond.wait()

    def _give_context(self, ctx: AioContext) -> None:
        with self._aio_cond:
            if ctx.open:
                self._aio_free.append(ctx)
            else:  # destroyed where a read was interrupted
                self._aio_live -= 1
            self._aio_cond.notify()

    def _map(self, fn, chunks: list[np.ndarray]) -> list[int]:
        if len(chunks) == 1:
            return [fn(chunks[0])]
        return list(self._executor().map(fn, chunks))

    def _split(self, run_len: np.ndarray) -> list[np.ndarray]:
        """Runs split into up to io_threads chunks of about equal rows (one with native AIO: it keeps the
        device's queue full from one thread)."""
        n_runs = run_len.shape[0]
        parts = 1 if self.aio else min(self.io_threads, max(1, n_runs // 16))
        if parts <= 1:
            return [np.arange(n_runs)]
        cum = np.cumsum(run_len)
        bounds = np.searchsorted(cum, np.linspace(0, cum[-1], parts + 1)[1:-1])
        return [c for c in np.split(np.arange(n_runs), bounds) if c.size]

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.io_threads, thread_name_prefix="tierec-disk")
        return self._pool

    # -------------------------------------------------------- maintenance

    def garbage_ratio(self) -> float:
        """Slots of segments in use per live record (1.0 = no dead space)."""
        used = (self.n_segments - len(self._free_segs)) * self.seg_rows
        return used / max(self.live_rows, 1)

    def compact(self, most: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Rewrite the live records of the emptiest segments until the segments in use hold at most
        ``max_ratio`` slots per live record (or no segment is emptier than that ratio asks); ``most``: move at
        most this many records now (a segment may be left part moved: the next call goes on with it).

        Returns (lids, new slots) of the moved records: the caller updates their homes.
        """
        moved_lids, moved_slots = [], []
        left = most
        for _ in range(self.n_segments):
            if left is not None and left <= 0:
                break
            used_segs = self.n_segments - len(self._free_segs)
            if used_segs <= 2 or self.garbage_ratio() <= self.max_ratio:
                break
            cand = self.seg_live.astype(np.float64)
            cand[self._free_segs] = np.inf
            if self._tail >= 0:
                cand[self._tail] = np.inf
            seg = int(np.argmin(cand))
            if cand[seg] > self.seg_rows / self.max_ratio:  # moving it would win back too little (or nothing)
                break
            lo = seg * self.seg_rows
            slots = lo + np.flatnonzero(_bits(self.live, np.arange(lo, lo + self.seg_rows)))
            if slots.size == 0:
                self._free_segs.append(seg)
                continue
            if left is not None:
                slots = slots[:left]
                left -= slots.size
            recs = self._read_full(slots)
            lids = recs[:, 0].copy().view(np.int32).astype(np.int64)
            self.free(slots)
            moved_lids.append(lids)
            moved_slots.append(self._append(lids, recs[:, 1:]))
        if not moved_lids:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        return np.concatenate(moved_lids), np.concatenate(moved_slots)

    def drop_page_cache(self, sync: bool = False) -> None:
        """Ask the kernel to drop this file's clean pages; ``sync`` first writes dirty ones (all dropped)."""
        if sync:
            self._reap_flushes(wait=True)
            os.fsync(self.fd)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        for pool in (self._pool, self._ahead_pool, self._flush_pool):
            if pool is not None:
                pool.shutdown(wait=True)
        self._pool = self._ahead_pool = self._flush_pool = None
        self._flushes = []
        with self._aio_cond:
            self._aio_live -= len(self._aio_free)
            self._release()  # the contexts, then the descriptors (once: the finalizer is spent)


def _empty_like(a: np.ndarray) -> np.ndarray:
    """A new array of no rows with ``a``'s row shape and dtype (``a[:0]`` would keep ``a``'s memory alive)."""
    return np.empty((0, *a.shape[1:]), dtype=a.dtype)


class PendingRead:
    """Records being read ahead by :meth:`DiskTier.submit_read`; :meth:`result` waits for them.

    ``read_s`` is the wall time the reads took (submit to the last byte), ``wait_s`` the part of it the
    caller of :meth:`result` spent waiting: the rest was hidden behind whatever the caller did meanwhile.
    """

    def __init__(self, disk: DiskTier, slots: np.ndarray, order: np.ndarray, buf: np.ndarray) -> None:
        self.disk, self.slots, self.order, self.buf = disk, slots, order, buf
        self.futures: list = []
        self.started = time.perf_counter()
        self.finished = self.started
        self.read_s = 0.0
        self.wait_s = 0.0
        self._out: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes + (self._out.nbytes if self._out is not None else 0)

    def timed(self, fn, *args) -> int:
        status = fn(*args)
        self.finished = max(self.finished, time.perf_counter())  # one float store: safe across threads
        return status

    def read_before(self, t: float) -> bool:
        """Every record is in memory, read without error before ``time.perf_counter()`` was ``t`` (what a
        record moved since then may keep: a read still running might find another record at its old slot)."""
        if self._out is not None:  # taken: by a lookup, which holds the store as a move does
            return True
        return all(f.done() for f in self.futures) and self.finished <= t and all(f.result() >= 0 for f in self.futures)

    def result(self) -> np.ndarray:
        """Records [n, 1 + W] (the lid header first) in the order the slots were given."""
        if self._out is None:
            t0 = time.perf_counter()
            status = [f.result() for f in self.futures]
            self.wait_s = time.perf_counter() - t0
            self.read_s = self.finished - self.started
            if status and min(status) < 0:  # short or refused (O_DIRECT): the on-demand path says why, or recovers
                out = self.disk._read_full(self.slots)
            else:
                out = np.empty_like(self.buf)
                out[self.order] = self.buf
                self.disk.bytes_read += self.buf.nbytes
            self._out, self.buf = out, _empty_like(self.buf)  # not a view: that would keep the buffer alive
        return self._out

    def cancel(self) -> None:
        """Wait out reads still running (their buffer must outlive them) and drop the records."""
        for f in self.futures:
            f.result()
        self.read_s = self.finished - self.started
        self._out, self.buf = None, _empty_like(self.buf)
