"""The device's random-read rate: aligned O_DIRECT reads at random offsets of a file, as blocking ``pread`` calls
from several threads, or (``--aio DEPTH``) through Linux native AIO from one thread with DEPTH in flight.

The disk tier reads rows the same way (tierec/store/disk.py, ``store.io_engine``),
so this is the ceiling its reads per second meet: compare it with the tiers
benchmark's rows read per second (docs/scale.md). ``cpu_us_per_read`` is the
process's CPU time per read (under a hypervisor, system calls and wake-ups cost
VM exits).

    python -m benchmarks.disk_rate --dir /var/tmp --size 1GiB --block 4096 --threads 8 --seconds 5
    python -m benchmarks.disk_rate --dir /var/tmp --size 1GiB --block 4096 --aio 64 --seconds 5

>>> from benchmarks.disk_rate import offsets
>>> o = offsets(1 << 20, 4096, 100, seed=0); bool((o % 4096 == 0).all() and (o < 1 << 20).all())
True
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import tempfile
import threading
import time

import numpy as np


def offsets(file_bytes: int, block: int, n: int, seed: int) -> np.ndarray:
    """``n`` random block-aligned offsets within the file."""
    return np.random.default_rng(seed).integers(0, file_bytes // block, size=n) * block


def run(directory: str, file_bytes: int, block: int, threads: int, seconds: float, aio: int = 0) -> dict:
    fd, path = tempfile.mkstemp(dir=directory, prefix="tierec-diskrate-")
    try:
        chunk = np.random.default_rng(1).integers(0, 255, size=1 << 24, dtype=np.uint8).tobytes()
        for off in range(0, file_bytes, len(chunk)):
            os.pwrite(fd, chunk[: min(len(chunk), file_bytes - off)], off)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        try:
            dfd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            direct = True
        except OSError:
            dfd, direct = os.open(path, os.O_RDONLY), False
        counts = [0] * threads
        cpu0 = time.process_time()
        stop = time.perf_counter() + seconds
        if aio:
            t0 = time.perf_counter()
            reads = _aio_reads(dfd, file_bytes, block, aio, stop)
            took, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            os.close(dfd)
            return {"reads_per_s": reads / took, "mib_per_s": reads * block / took / 2**20, "block": block,
                    "aio_depth": aio, "file_bytes": file_bytes, "o_direct": direct, "seconds": took,
                    "cpu_us_per_read": 1e6 * cpu / max(reads, 1)}

        def reader(i: int) -> None:
            buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
            offs = offsets(file_bytes, block, 1 << 20, seed=i + 2)
            k = 0
            while time.perf_counter() < stop:
                os.preadv(dfd, [buf], int(offs[k % offs.size]))
                k += 1
            counts[i] = k

        pool = [threading.Thread(target=reader, args=(i,)) for i in range(threads)]
        t0 = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        took, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        os.close(dfd)
    finally:
        os.close(fd)
        os.unlink(path)
    reads = sum(counts)
    return {"reads_per_s": reads / took, "mib_per_s": reads * block / took / 2**20, "block": block,
            "threads": threads, "file_bytes": file_bytes, "o_direct": direct, "seconds": took,
            "cpu_us_per_read": 1e6 * cpu / max(reads, 1)}


def _aio_reads(dfd: int, file_bytes: int, block: int, depth: int, stop: float) -> int:
    """Rounds of ``4 * depth`` random reads through one native AIO context (``depth`` in flight) until ``stop``."""
    from tierec.store.aio import open_context

    ctx = open_context(depth)
    if ctx is None:
        raise SystemExit("benchmarks.disk_rate: this system refuses native AIO (io_setup); use --threads")
    buf = mmap.mmap(-1, block * 4 * depth)  # page-aligned, as O_DIRECT needs
    base = np.frombuffer(buf, dtype=np.uint8).ctypes.data
    dsts = np.uint64(base) + np.arange(4 * depth, dtype=np.uint64) * np.uint64(block)
    lengths, got = np.full(4 * depth, block, dtype=np.int64), np.zeros(4 * depth, dtype=np.int64)
    reads, seed = 0, 2
    try:
        while time.perf_counter() < stop:
            ctx.read(dfd, offsets(file_bytes, block, 4 * depth, seed), lengths, dsts, got)
            if (got != block).any():
                raise SystemExit(f"benchmarks.disk_rate: a read got {int(got.min())} bytes of {block}")
            reads, seed = reads + got.size, seed + 1
    finally:
        ctx.close()
    return reads


def main(argv: list[str] | None = None) -> int:
    from tierec.store.sizes import parse_size

    p = argparse.ArgumentParser(prog="benchmarks.disk_rate", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--size", default="1GiB")
    p.add_argument("--block", type=int, default=4096)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--aio", type=int, default=0, metavar="DEPTH", help="read through native AIO, DEPTH in flight, "
                                                                      "from one thread (the disk tier's default: 64)")
    a = p.parse_args(argv)
    print(json.dumps(run(a.dir, parse_size(a.size), a.block, a.threads, a.seconds, a.aio)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
