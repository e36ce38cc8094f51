"""How the disk tier's records come off its file: the read kernels and the read plans.

Records wanted are first grouped into runs of consecutive slots (:func:`runs`);
through an ``O_DIRECT`` descriptor the runs become aligned byte spans, runs
less than ``DIRECT_GAP`` apart sharing one (:func:`spans`), each read at most
``DIRECT_CHUNK`` bytes a call into scratch memory and its records copied out.
The spans go to the device either as blocking ``pread`` calls from a numba
kernel (:func:`read_spans_blocking`, one thread's share of them) or all at once
through a native AIO context (:func:`read_spans_aio`, tierec/store/aio.py).
Without ``O_DIRECT`` the runs are read buffered, straight into their rows
(:func:`read_runs_buffered`). tierec/store/disk.py decides which and on what
thread.

>>> slot, length, first = runs(np.array([3, 4, 5, 9]))
>>> slot.tolist(), length.tolist(), first.tolist()
([3, 9], [3, 1], [0, 3])
"""

from __future__ import annotations

import ctypes
import os

import numba as nb
import numpy as np

from tierec.store.aio import AioContext

_LIBC = ctypes.CDLL(None, use_errno=True)
_pread = _LIBC.pread
_pread.restype = ctypes.c_ssize_t
_pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64]
_fadvise = _LIBC.posix_fadvise
_fadvise.restype = ctypes.c_int
_fadvise.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
_DONTNEED = os.POSIX_FADV_DONTNEED
PAGE = os.sysconf("SC_PAGE_SIZE")
DIRECT_ALIGN = 512  # O_DIRECT offsets, lengths and buffers: multiples of the logical block size
DIRECT_CHUNK = 1 << 18  # bytes per O_DIRECT read call at most: 64 KiB cost the read threads 1.5x the CPU, 1 MiB little less
# than this and 8 MiB of scratch over the read threads
DIRECT_GAP = 16384  # records closer than this share one O_DIRECT read: fewer requests, a few more bytes
AIO_DEPTH = 64  # native AIO: reads in flight per context (8 KiB at random: 4-5 us of CPU a read at 64, 8 at 16)
AIO_SCRATCH = 1 << 20  # native AIO: bytes of each of a read's two batches (one copied out while the other reads)


@nb.njit(nogil=True)  # not cached: it calls ctypes functions by address
def read_runs_buffered(fd, run_slot, run_len, run_dst, rec_bytes, out, drop):
    """Read runs of consecutive records into ``out`` rows ``run_dst[r] ..``; 0 or -1 on error.

    With ``drop`` the pages just read leave the page cache at once (each run's
    own range: cheap, unlike a walk over the whole file).
    """
    base = out.ctypes.data
    for r in range(run_slot.shape[0]):
        nbytes = run_len[r] * rec_bytes
        off = run_slot[r] * rec_bytes
        dst = base + run_dst[r] * rec_bytes
        done = 0
        while done < nbytes:
            got = _pread(fd, dst + done, nbytes - done, off + done)
            if got <= 0:
                return -1
            done += got
        if drop:  # whole pages only are dropped: widen the range to page bounds
            lo = off - off % PAGE
            hi = off + nbytes + (PAGE - (off + nbytes) % PAGE) % PAGE
            _fadvise(fd, lo, hi - lo, _DONTNEED)
    return 0


@nb.njit(nogil=True)  # not cached: it calls a ctypes function by address
def _pread_spans(fd, span_lo, span_hi, span_run, run_slot, run_len, run_dst, rec_bytes, out_bytes, scratch, s_off, cap):
    """Read aligned spans through an O_DIRECT descriptor (no page cache at all); copy out their runs.

    Span s covers bytes [span_lo[s], span_hi[s]) (multiples of the alignment)
    and holds runs span_run[s] .. span_run[s + 1] - 1, read ``cap`` bytes at a
    time into the aligned part of ``scratch`` (from ``s_off``). 0, or -1 when
    a read comes back short of a record.
    """
    sptr = scratch.ctypes.data + s_off
    for sp in range(span_lo.shape[0]):
        pos = span_lo[sp]
        hi = span_hi[sp]
        want = 0
        copied = 0
        last = span_run[sp + 1]
        for r in range(span_run[sp], last):
            want += run_len[r] * rec_bytes
        first = span_run[sp]  # the runs come in slot order: the first one not read to its end yet
        while pos < hi:
            n = min(cap, hi - pos)
            got = _pread(fd, sptr, n, pos)
            if got <= 0:
                break
            while first < last and (run_slot[first] + run_len[first]) * rec_bytes <= pos:
                first += 1
            r = first
            while r < last and run_slot[r] * rec_bytes < pos + got:
                start = run_slot[r] * rec_bytes
                end = start + run_len[r] * rec_bytes
                a = max(pos, start)
                b = min(pos + got, end)
                if a < b:
                    dst = run_dst[r] * rec_bytes + a - start
                    for i in range(b - a):
                        out_bytes[dst + i] = scratch[s_off + a - pos + i]
                    copied += b - a
                r += 1
            pos += n
        if copied != want:
            return -1
    return 0


@nb.njit(cache=True, nogil=True)
def _copy_runs(req_pos, req_got, req_scr, q0, q1, run_slot, run_len, run_dst, rec_bytes, out_bytes, scratch, r0):
    """Copy the runs' bytes that reads ``q0 .. q1 - 1`` brought into ``scratch`` (read q: file bytes from
    ``req_pos[q]``, ``req_got[q]`` of them, at ``scratch[req_scr[q]]``) to their rows of ``out_bytes``. Reads
    and runs come in file order; ``r0``: the first run not read to its end before read q0. Returns (bytes
    copied, the first run not read to its end after read q1 - 1)."""
    copied = 0
    first = r0
    n_runs = run_slot.shape[0]
    for q in range(q0, q1):
        pos = req_pos[q]
        got = max(req_got[q], 0)
        while first < n_runs and (run_slot[first] + run_len[first]) * rec_bytes <= pos:
            first += 1
        r = first
        while r < n_runs and run_slot[r] * rec_bytes < pos + got:
            start = run_slot[r] * rec_bytes
            a = max(pos, start)
            b = min(pos + got, start + run_len[r] * rec_bytes)
            if a < b:
                dst = run_dst[r] * rec_bytes + a - start
                src = req_scr[q] + a - pos
                out_bytes[dst : dst + b - a] = scratch[src : src + b - a]
                copied += b - a
            r += 1
    return copied, first


@nb.njit(cache=True)
def _batches(req_len, most_bytes, most_reads):
    """[n] batch number of each read (consecutive reads, at most ``most_bytes`` and ``most_reads`` a batch) and
    [n] its byte offset inside its batch."""
    n = req_len.shape[0]
    batch = np.empty(n, dtype=np.int64)
    at = np.empty(n, dtype=np.int64)
    b = 0
    used = 0
    count = 0
    for q in range(n):
        if count == most_reads or (count and used + req_len[q] > most_bytes):
            b += 1
            used = 0
            count = 0
        batch[q] = b
        at[q] = used
        used += req_len[q]
        count += 1
    return batch, at


def spans(run_slot: np.ndarray, run_len: np.ndarray, rec_bytes: int, align: int, gap: int) -> tuple[np.ndarray, ...]:
    """Aligned byte spans covering the runs; runs closer than ``gap`` bytes share one span (one request)."""
    start = run_slot * rec_bytes
    end = start + run_len * rec_bytes
    lo = start - start % align
    hi = end + (align - end % align) % align
    new = np.ones(lo.shape[0], dtype=bool)
    new[1:] = lo[1:] > hi[:-1] + gap
    first = np.flatnonzero(new)
    span_run = np.append(first, lo.shape[0]).astype(np.int64)
    span_hi = np.maximum.reduceat(hi, first) if first.size else hi[:0]
    return lo[first], span_hi, span_run


def runs(sorted_slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first slot, length, position in the sorted list) of each run of consecutive slots."""
    n = sorted_slots.shape[0]
    starts = np.flatnonzero(np.diff(sorted_slots, prepend=sorted_slots[0] - 2) != 1)
    lengths = np.diff(np.append(starts, n))
    return sorted_slots[starts], lengths.astype(np.int64), starts.astype(np.int64)


def direct_read_bytes(slots: np.ndarray, rec_bytes: int) -> int:
    """Bytes the O_DIRECT reads of the records at ``slots`` (any order, duplicates allowed) cover, by the rule
    the tier reads with: aligned spans, records closer than ``DIRECT_GAP`` in one request.

    >>> direct_read_bytes(np.array([2, 0, 1, 1000]), 32)  # two requests of 512 bytes: record 1000 lies past the gap
    1024
    >>> direct_read_bytes(np.array([0, 400]), 32)  # 12,800 bytes apart: one request
    13312
    """
    uniq = np.unique(np.asarray(slots, dtype=np.int64))
    if uniq.size == 0:
        return 0
    run_slot, run_len, _ = runs(uniq)
    lo, hi, _ = spans(run_slot, run_len, rec_bytes, DIRECT_ALIGN, DIRECT_GAP)
    return int((hi - lo).sum())


def read_spans_blocking(dfd: int, span_lo: np.ndarray, span_hi: np.ndarray, span_run: np.ndarray, run_slot: np.ndarray,
                        run_len: np.ndarray, run_dst: np.ndarray, rec_bytes: int, out_bytes: np.ndarray) -> int:
    """The spans read by blocking calls on this thread, ``DIRECT_CHUNK`` bytes at a time through one scratch
    buffer; their runs' records into ``out_bytes`` (rows ``run_dst``). 0, or -1 when a read came back short."""
    scratch = np.empty(DIRECT_CHUNK + DIRECT_ALIGN, dtype=np.uint8)
    s_off = (-scratch.ctypes.data) % DIRECT_ALIGN
    return _pread_spans(dfd, span_lo, span_hi, span_run, run_slot, run_len, run_dst, rec_bytes, out_bytes, scratch, s_off,
                        DIRECT_CHUNK)


def read_spans_aio(ctx: AioContext, dfd: int, span_lo: np.ndarray, span_hi: np.ndarray, run_slot: np.ndarray,
                   run_len: np.ndarray, run_dst: np.ndarray, rec_bytes: int, out_bytes: np.ndarray) -> int:
    """The spans read through ``ctx``, in reads of at most ``DIRECT_CHUNK`` bytes, batch by batch through two
    scratch buffers (one batch's records copied out while the next one reads); 0, or -1 when a read failed or
    came back short of a record. An error of the AIO calls themselves raises (the context is then closed)."""
    pieces = -(-(span_hi - span_lo) // DIRECT_CHUNK)
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)
    req_pos = np.repeat(span_lo, pieces) + (np.arange(first.shape[0]) - first) * DIRECT_CHUNK
    req_len = np.minimum(np.repeat(span_hi, pieces) - req_pos, DIRECT_CHUNK)
    batch, at = _batches(req_len, AIO_SCRATCH, AIO_DEPTH // 2)
    scratch = np.empty(2 * AIO_SCRATCH + DIRECT_ALIGN, dtype=np.uint8)
    req_scr = (-scratch.ctypes.data) % DIRECT_ALIGN + (batch % 2) * AIO_SCRATCH + at
    bounds = np.searchsorted(batch, np.arange(int(batch[-1]) + 2))  # reads of batch b: bounds[b] .. bounds[b + 1]
    got = np.zeros(req_pos.shape[0], dtype=np.int64)
    state = [0, 0]  # bytes copied, the first run not read to its end

    def copy_out(b: int) -> None:
        copied, state[1] = _copy_runs(req_pos, got, req_scr, int(bounds[b]), int(bounds[b + 1]), run_slot, run_len,
                                      run_dst, rec_bytes, out_bytes, scratch, state[1])
        state[0] += copied

    ctx.read(dfd, req_pos, req_len, np.uint64(scratch.ctypes.data) + req_scr.astype(np.uint64), got,
             on_done=copy_out, batch_of=batch)
    return 0 if state[0] == int(run_len.sum()) * rec_bytes else -1
