"""Linux native asynchronous reads (``io_setup``, ``io_submit``, ``io_getevents``) for the disk tier.

A blocking ``pread`` costs its thread a system call, a sleep and a wake-up for
every request; under a hypervisor each of those is a VM exit. Here a batch of
reads goes to the kernel in one ``io_submit`` and their completions come back
together from ``io_getevents``, so the device sees the same queue depth for
about a third of the CPU: O_DIRECT reads of 8 KiB at random on a KVM guest's
virtio disk cost 3-5 us of CPU each at 64 in flight against 11 us from eight
threads calling ``pread`` in numba kernels, and served 1.3-1.6x the reads a second
(2026-12-06, EPYC Zen 4 host of docs/performance.md; ``benchmarks.disk_rate --aio 64``).

Native AIO is asynchronous only for ``O_DIRECT`` descriptors (the disk tier's
reads); elsewhere the kernel does the reads inside ``io_submit``. Where the
kernel or the platform does not offer it (another architecture, a container
that forbids the system calls, ``fs.aio-max-nr`` used up), :func:`open_context`
returns None and the caller reads with threads.

>>> import os, tempfile, numpy as np
>>> ctx = open_context(4)
>>> path = os.path.join(tempfile.mkdtemp(), "f"); open(path, "wb").write(bytes(range(200)))
200
>>> fd = os.open(path, os.O_RDONLY); buf, got = np.zeros(12, dtype=np.uint8), np.zeros(3, dtype=np.int64)
>>> if ctx: ctx.read(fd, np.array([10, 100, 196]), np.array([4, 4, 4]), np.uint64(buf.ctypes.data) + np.array([0, 4, 8], dtype=np.uint64), got)
>>> got.tolist() if ctx else [4, 4, 4]
[4, 4, 4]
>>> buf.tolist() if ctx else [10, 11, 12, 13, 100, 101, 102, 103, 196, 197, 198, 199]
[10, 11, 12, 13, 100, 101, 102, 103, 196, 197, 198, 199]
>>> os.close(fd); ctx.close() if ctx else None
"""

from __future__ import annotations

import ctypes
import errno
import platform
import sys

import numpy as np

# (io_setup, io_destroy, io_submit, io_getevents) by machine: the generic table (arm64, riscv64) and x86-64's own
_SYSCALLS = {"x86_64": (206, 207, 209, 208), "aarch64": (0, 1, 2, 4), "arm64": (0, 1, 2, 4), "riscv64": (0, 1, 2, 4)}
_IOCB_WORDS = 8  # struct iocb: 64 bytes as eight u64 (little-endian field order)
_EVENT_WORDS = 4  # struct io_event: data, obj, res, res2
_PREAD = 0  # IOCB_CMD_PREAD


class AioContext:
    """One kernel AIO context with room for ``depth`` reads in flight; used by one thread at a time."""

    def __init__(self, libc: ctypes.CDLL, numbers: tuple[int, int, int, int], depth: int) -> None:
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._setup, self._destroy, self._submit, self._getevents = numbers
        self.depth = depth
        self._ctx = ctypes.c_ulong(0)
        if self._syscall(self._setup, ctypes.c_long(depth), ctypes.byref(self._ctx)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"io_setup: {errno.errorcode.get(err, err)}")
        self._events = np.zeros((depth, _EVENT_WORDS), dtype=np.int64)

    def read(self, fd: int, offsets: np.ndarray, lengths: np.ndarray, dsts: np.ndarray, got: np.ndarray,
             on_done=None, batch_of=None) -> None:
        """Read ``lengths[i]`` bytes at file offset ``offsets[i]`` to address ``dsts[i]`` for every i, at most
        ``depth`` in flight; ``got[i]``: the bytes read i got (a negative errno where it failed).

        ``batch_of`` [n] (non-decreasing batch numbers) and ``on_done(b)``: called once every read of batch
        ``b`` and of the batches before it completed, so the caller may reuse their buffers: the reads of
        batch ``b + 2`` are submitted only after ``on_done(b)`` returned.

        Whatever interrupts it (an error, ``KeyboardInterrupt``) first waits out the reads in flight (the
        context is destroyed: :attr:`open` turns false), so no read lands in a buffer freed meanwhile."""
        n = int(offsets.shape[0])
        if n == 0:
            return
        try:
            self._read(fd, offsets, lengths, dsts, got, on_done, batch_of)
        except BaseException:
            self.close()
            raise

    def _read(self, fd, offsets, lengths, dsts, got, on_done, batch_of) -> None:
        n = int(offsets.shape[0])
        iocbs = np.zeros((n, _IOCB_WORDS), dtype=np.uint64)
        iocbs[:, 0] = np.arange(n, dtype=np.uint64)  # aio_data: the read's index
        iocbs[:, 2] = np.uint64(_PREAD) | (np.uint64(fd) << np.uint64(32))  # opcode, priority 0, descriptor
        iocbs[:, 3] = dsts.astype(np.uint64)
        iocbs[:, 4] = lengths.astype(np.uint64)
        iocbs[:, 5] = offsets.astype(np.int64).view(np.uint64)
        ptrs = (np.uint64(iocbs.ctypes.data) + np.arange(n, dtype=np.uint64) * np.uint64(8 * _IOCB_WORDS))
        batch = np.zeros(n, dtype=np.int64) if batch_of is None else np.asarray(batch_of, dtype=np.int64)
        n_batches = int(batch[-1]) + 1
        left = np.bincount(batch, minlength=n_batches)  # reads of each batch not completed yet
        ends = np.cumsum(left)  # reads up to the end of each batch
        submitted = completed = 0
        finished = 0  # batches whose on_done ran
        while completed < n:
            # reads of batches up to two past the last finished one, as many as fit in the context
            limit = int(ends[min(finished + 1, n_batches - 1)])
            while submitted < limit and submitted - completed < self.depth:
                k = min(limit - submitted, self.depth - (submitted - completed))
                r = self._syscall(self._submit, self._ctx, ctypes.c_long(k), ctypes.c_void_p(int(ptrs.ctypes.data) + 8 * submitted))
                if r < 0:
                    err = ctypes.get_errno()
                    if err in (errno.EAGAIN, errno.EINTR) and submitted > completed:
                        break  # reap first
                    if err == errno.EINTR:
                        continue
                    raise OSError(err, f"io_submit: {errno.errorcode.get(err, err)}")
                submitted += r
            r = self._syscall(self._getevents, self._ctx, ctypes.c_long(1), ctypes.c_long(self.depth),
                              ctypes.c_void_p(self._events.ctypes.data), None)
            if r < 0:
                err = ctypes.get_errno()
                if err == errno.EINTR:
                    continue
                raise OSError(err, f"io_getevents: {errno.errorcode.get(err, err)}")
            ev = self._events[:r]
            idx = ev[:, 0]
            got[idx] = ev[:, 2]
            np.subtract.at(left, batch[idx], 1)
            completed += r
            while finished < n_batches and left[finished] == 0:
                if on_done is not None:
                    on_done(finished)
                finished += 1

    @property
    def open(self) -> bool:
        return bool(self._ctx.value)

    def close(self) -> None:
        """Destroy the context: the kernel cancels or waits out the reads in flight first."""
        if self._ctx.value:
            self._syscall(self._destroy, self._ctx)
            self._ctx = ctypes.c_ulong(0)


def open_context(depth: int) -> AioContext | None:
    """A context for ``depth`` reads in flight, or None where native AIO is not offered here."""
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None or sys.byteorder != "little" or not sys.platform.startswith("linux"):
        return None
    try:
        return AioContext(ctypes.CDLL(None, use_errno=True), numbers, depth)
    except OSError:
        return None
