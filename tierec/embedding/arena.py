"""Growable host arrays whose unused capacity costs no physical memory.

A table grows by whole blocks of rows (geometric capacity, so that inserts stay
amortised O(1)). With ``ndarray.resize`` the new tail is zero-filled at once, so
every page of the spare capacity is faulted in and resident long before a row
lives there. An :class:`Arena` is an anonymous private mapping that grows with
``mremap``: pages keep their contents and addresses move without copying, and
the new tail stays untouched (the kernel maps it on first write, already zero).
Physical memory then follows the rows actually written, to within a page.

Views from :meth:`Arena.array` keep the arena alive, but a growth may move the
mapping: like a realloc, it leaves earlier views pointing at released memory.
Callers must take views afresh after each growth (``TableGroup`` does).

Linux only (``mremap``); :func:`arena_supported` says whether this host has it,
and callers fall back to ``ndarray.resize`` elsewhere.

>>> import numpy as np
>>> a = Arena(1 << 16)
>>> x = a.array(np.float32, (16, 4)); x[:] = 1.0
>>> a.grow(1 << 20)
>>> y = a.array(np.float32, (65536, 4))
>>> float(y[:16].sum()), float(y[16:].sum())
(64.0, 0.0)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import os
import sys
import weakref

import numpy as np

_MREMAP_MAYMOVE = 1
_MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = mmap.PAGESIZE


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        for name in ("mmap", "mremap", "munmap", "mincore"):
            getattr(lib, name)
    except (OSError, AttributeError):  # no loadable libc, or one without mremap: fall back
        return None
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    lib.mremap.restype = ctypes.c_void_p
    lib.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
    lib.munmap.restype = ctypes.c_int
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.mincore.restype = ctypes.c_int
    lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return lib


@functools.cache
def _lib() -> ctypes.CDLL | None:  # loaded on first use
    return _libc()


def arena_supported() -> bool:
    return _lib() is not None and hasattr(mmap, "MAP_ANONYMOUS")


def _round_up(n: int) -> int:
    return max(PAGE, -(-n // PAGE) * PAGE)


def _oserror(what: str, nbytes: int) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what} of {nbytes:,} bytes failed: {os.strerror(err)}")


class _Mapping:
    """Address and length of the current mapping, shared with the finalizer."""

    def __init__(self, addr: int, size: int) -> None:
        self.addr, self.size = addr, size


def _unmap(m: _Mapping) -> None:
    lib = _lib()
    if lib is not None and m.size:
        lib.munmap(m.addr, m.size)
        m.size = 0


class _View:
    """Exposes the start of an arena to numpy as one array and keeps the arena alive."""

    def __init__(self, arena: Arena, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.arena = arena
        self.__array_interface__ = {
            "data": (arena.address, False),
            "shape": shape,
            "typestr": dtype.str,
            "version": 3,
        }


class Arena:
    """One anonymous mapping of ``nbytes`` (rounded up to pages) that grows in place or moves with mremap."""

    def __init__(self, nbytes: int) -> None:
        lib = _lib()
        if lib is None:
            raise OSError("Arena needs Linux mmap/mremap")
        size = _round_up(nbytes)
        addr = lib.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if addr is None or addr == _MAP_FAILED:
            raise _oserror("mmap", size)
        self._map = _Mapping(addr, size)
        weakref.finalize(self, _unmap, self._map)

    def __reduce__(self):
        raise TypeError("an Arena cannot be copied or pickled (two owners would unmap one mapping); copy its arrays")

    @property
    def address(self) -> int:
        return self._map.addr

    @property
    def nbytes(self) -> int:
        return self._map.size

    def grow(self, nbytes: int) -> None:
        """At least ``nbytes`` of mapping; contents kept, new bytes zero, nothing touched."""
        size = _round_up(nbytes)
        if size <= self._map.size:
            return
        addr = _lib().mremap(self._map.addr, self._map.size, size, _MREMAP_MAYMOVE)
        if addr is None or addr == _MAP_FAILED:
            raise _oserror("mremap", size)
        self._map.addr, self._map.size = addr, size

    def array(self, dtype: np.dtype | type, shape: tuple[int, ...]) -> np.ndarray:
        """A ``shape`` array of ``dtype`` over the start of the mapping."""
        dt = np.dtype(dtype)
        end = dt.itemsize * int(np.prod(shape))
        if end > self._map.size:
            raise ValueError(f"a {shape} {dt} view needs {end:,} bytes, the arena has {self._map.size:,}")
        return np.asarray(_View(self, dt, tuple(shape)))


def resident_bytes(a: np.ndarray) -> int:
    """Bytes of the pages under ``a``'s buffer that are in physical memory (Linux ``mincore``).

    Falls back to ``a.nbytes`` where mincore is not available.
    """
    lib = _lib()
    if lib is None or a.nbytes == 0:
        return int(a.nbytes)
    start = a.__array_interface__["data"][0]
    first = start - start % PAGE
    length = start + a.nbytes - first
    pages = -(-length // PAGE)
    vec = (ctypes.c_ubyte * pages)()
    if lib.mincore(first, length, vec) != 0:
        return int(a.nbytes)
    resident = np.frombuffer(vec, dtype=np.uint8) & 1
    return int(resident.sum()) * PAGE


class GrowableArray:
    """An array of ``[capacity, *row_shape]`` whose capacity grows in an :class:`Arena`.

    :meth:`grow` returns the new, larger array holding the first ``used`` rows of the old
    one (rows past them hold anything); nothing past them is touched. Off Linux it falls
    back to a fresh array and a copy of those rows. Earlier arrays must not be used after
    a growth.

    >>> g = GrowableArray(np.arange(4, dtype=np.int64))
    >>> a = g.grow(1000, used=3)
    >>> a.shape, a[:3].tolist()
    ((1000,), [0, 1, 2])
    """

    def __init__(self, initial: np.ndarray) -> None:
        self.dtype = initial.dtype
        self.row_shape = initial.shape[1:]
        self._row_bytes = self.dtype.itemsize * int(np.prod(self.row_shape))
        self._arena = Arena(max(initial.nbytes, 1)) if arena_supported() else None
        self.array = self._view(initial.shape[0]) if self._arena is not None else np.empty_like(initial)
        self.array[...] = initial

    def __reduce__(self):  # a copy (deepcopy, pickle) is a new GrowableArray holding a copy of the rows
        return (GrowableArray, (np.array(self.array),))

    def _view(self, rows: int) -> np.ndarray:
        return self._arena.array(self.dtype, (rows, *self.row_shape))

    def grow(self, capacity: int, used: int) -> np.ndarray:
        if capacity <= self.array.shape[0]:
            return self.array
        if self._arena is not None:
            self._arena.grow(capacity * self._row_bytes)
            self.array = self._view(capacity)
        else:
            fresh = np.empty((capacity, *self.row_shape), dtype=self.dtype)
            fresh[:used] = self.array[:used]
            self.array = fresh
        return self.array
