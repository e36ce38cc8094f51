"""HostTier: rows (weights + optimizer state as one record of 4-byte words) in host DRAM.

A record is ``width`` float32 words: the row's values, or the packed bits of a
compact encoding (tierec/store/codec.py), which are copied, never computed on.

A bounded tier reserves its whole array up front, but the operating system
only backs the pages that are touched, and freed slots are reused first
(a stack), so resident memory follows the peak number of rows held, never the
reservation. An unbounded tier grows by doubling.

>>> import numpy as np
>>> from tierec.store.host import HostTier
>>> h = HostTier(width=3, max_rows=4)
>>> s = h.alloc(3); h.write(s, np.ones((3, 3), np.float32)); h.used, h.free_rows
(3, 1)
>>> h.free(s[:1]); h.alloc(5).tolist()  # only two slots are left
[0, 3]
"""

from __future__ import annotations

import numpy as np

from tierec.store.rowcopy import gather_rows, scatter_rows


class HostTier:
    def __init__(self, width: int, max_rows: int | None) -> None:
        self.width = width  # 4-byte words per record
        self.max_rows = max_rows  # None = unbounded
        first = max_rows if max_rows is not None else 1024
        self.data = np.empty((first, width), dtype=np.float32)  # [cap, W]; pages touched on use
        self.high = 0  # slots ever handed out
        self._free = np.empty(0, dtype=np.int64)
        self._n_free = 0
        self.used = 0

    @property
    def free_rows(self) -> int | None:
        """Rows that can still be allocated (None = unbounded)."""
        if self.max_rows is None:
            return None
        return self.max_rows - self.used

    def nbytes(self) -> int:  # bytes backed by memory: slots ever touched
        return self.high * self.width * 4

    def alloc(self, n: int) -> np.ndarray:
        """Up to ``n`` free slots (fewer when the tier is full)."""
        if self.max_rows is not None:
            n = min(n, self.max_rows - self.used)
        reuse = min(n, self._n_free)
        out = np.empty(n, dtype=np.int64)
        out[:reuse] = self._free[self._n_free - reuse : self._n_free]
        self._n_free -= reuse
        fresh = n - reuse
        if self.high + fresh > self.data.shape[0]:
            grown = np.empty((max(self.high + fresh, 2 * self.data.shape[0]), self.width), dtype=np.float32)
            grown[: self.high] = self.data[: self.high]
            self.data = grown
        out[reuse:] = np.arange(self.high, self.high + fresh)
        self.high += fresh
        self.used += n
        top = out[:reuse]
        if reuse < 2 or bool((top[1:] < top[:-1]).all()):  # one freed batch: pushed highest first
            out[:reuse] = top[::-1].copy()
            return out  # fresh slots lie above every slot handed out before
        return np.sort(out)

    def free(self, slots: np.ndarray) -> None:
        n = slots.shape[0]
        if n == 0:
            return
        need = self._n_free + n
        if need > self._free.shape[0]:
            self._free = np.resize(self._free, max(need, 2 * self._free.shape[0] + 16))
        # Highest first on the stack bottom: low slots are reused first, keeping touched pages few.
        self._free[self._n_free : need] = np.sort(slots)[::-1]
        self._n_free = need
        self.used -= n

    def read(self, slots: np.ndarray) -> np.ndarray:  # [n, W]
        return gather_rows(self.data, slots)

    def write(self, slots: np.ndarray, records: np.ndarray) -> None:  # slots distinct
        scatter_rows(self.data, slots, records)
