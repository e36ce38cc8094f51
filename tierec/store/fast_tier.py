"""FastTier: the slots of a tiered group's fast tier and what each one holds.

``capacity`` rows of weights and optimizer state (GPU memory when the device is
a GPU, else DRAM), slot 0 the shared row of zeros, and per slot: the directory
row it holds (``slot_lid``, -1 when free), the lookup that pinned it, the
lookup of the read-ahead window it is kept for, and whether it changed since it
came up. Free slots are a stack, slot 1 on top at the start, so which slot a
row gets depends only on the order of lookups and evictions (a lossy cold codec
makes numbers depend on it: tierec/store/state.py).

It moves records in and out (``gather``, ``scatter``) and lists the slots that
may leave (``evictable``); which of them leave, and where to, is the group's
(tierec/store/group.py).

>>> import numpy as np
>>> from tierec.embedding.layout import RecordLayout
>>> from tierec.embedding.table import TableConfig
>>> fast = FastTier(3, RecordLayout.of_tables([TableConfig(name="t", dim=2, features=["f"])]), "cpu")  # row-wise Adagrad
>>> slots = fast.take(2); slots.tolist(), fast.n_free
([1, 2], 1)
>>> fast.scatter(slots, np.array([[1, 2, 0.5], [3, 4, 0.25]], dtype=np.float32))
>>> fast.gather(slots[::-1]).tolist()
[[3.0, 4.0, 0.25], [1.0, 2.0, 0.5]]
"""

from __future__ import annotations

import numba as nb
import numpy as np
import torch

from tierec.device import copy_to
from tierec.embedding.layout import RecordLayout
from tierec.embedding.prefetch import AHEAD, prefetch_row
from tierec.store import hotness
from tierec.store.rowcopy import put_rows, take_rows

ZERO_SLOT = 0


class FastTier:
    def __init__(self, capacity: int, layout: RecordLayout, device: torch.device | str, in_flight: int = 1) -> None:
        self.capacity = capacity
        self.in_flight = in_flight  # a slot used by lookup c stays pinned until lookup c + in_flight starts
        self.dim = layout.dim
        self.device = torch.device(device)
        self.state_widths = layout.widths  # float32 words of each optimizer state per row
        self.record_width = layout.width  # float32 per row: the weights, then each state in turn
        # [capacity + 1, D] with slot 0 the shared zero row; pages are touched on use.
        self.weights = torch.empty(capacity + 1, self.dim, device=self.device)
        self.weights[ZERO_SLOT].zero_()
        self.state = layout.new_state(capacity + 1, self.device)
        self.slot_lid = np.full(capacity + 1, -1, dtype=np.int32)  # [C+1] directory row in each slot
        self.pin = np.zeros(capacity + 1, dtype=np.int64)  # [C+1] lookup that pinned it
        self.keep = np.zeros(capacity + 1, dtype=np.int64)  # [C+1] a later lookup of the read-ahead window needs it
        self.dirty = np.zeros(capacity + 1, dtype=bool)  # [C+1] changed since it came up
        # [C+1] the training step that next uses the row, copied from the store's horizon when a lookup last used it
        # (0: none, or not copied); eviction reads it instead of the horizon's per-row array (hotness.hinted_score)
        self.next_use = np.zeros(capacity + 1, dtype=np.int32)
        self.free_slots = np.arange(capacity, 0, -1, dtype=np.int32)  # stack, slot 1 on top
        self.n_free = capacity

    # ------------------------------------------------------------ slots

    def take(self, n: int) -> np.ndarray:
        """``n`` free slots (at most as many as are free), off the top of the stack."""
        n = min(n, self.n_free)
        top = self.n_free
        slots = self.free_slots[top - n : top][::-1].astype(np.int64)
        self.n_free = top - n
        return slots

    def push_free(self, slots: np.ndarray) -> None:
        top = self.n_free
        self.free_slots[top : top + slots.size] = slots
        self.n_free = top + slots.size

    def release(self, slots: np.ndarray) -> None:
        """Slots whose rows left: empty, unpinned, clean, free."""
        self.slot_lid[slots] = -1
        self.dirty[slots] = False
        self.pin[slots] = 0
        self.keep[slots] = 0
        self.next_use[slots] = 0
        self.push_free(slots)

    def note_uses(self, slots: np.ndarray, lids: np.ndarray, next_at: np.ndarray) -> None:
        """Copy the next uses (``next_at`` [lids], the horizon's) of the rows ``lids`` just looked up in ``slots``."""
        _copy_uses(self.next_use, slots, lids, next_at)

    def keep_until(self, slots: np.ndarray, until: np.ndarray) -> None:
        """Rows in ``slots`` are needed until lookup ``until`` (each) by a read-ahead window: kept till then
        unless nothing else can leave (a later time wins)."""
        _raise_keep(self.keep, slots, until)

    def forget_uses(self) -> None:
        """The horizon forgot its batches: no copy holds."""
        self.next_use[:] = 0

    def restack(self, saved: np.ndarray) -> None:
        """The free-slot stack as ``saved`` (a checkpoint's order), below it the other free slots."""
        free = np.flatnonzero(self.slot_lid[1:] < 0) + 1
        in_saved = np.zeros(self.capacity + 1, dtype=bool)
        in_saved[saved] = True
        stack = np.concatenate([free[~in_saved[free]][::-1], saved[self.slot_lid[saved] < 0]])
        self.free_slots[: stack.size] = stack
        self.n_free = stack.size

    def evictable(self, clock: int, score: np.ndarray, soft: bool = False, in_flight: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(slots, scores) of occupied slots that may leave at lookup ``clock`` (hotness.evictable).

        The rows of the last ``in_flight`` lookups stay (this tier's own rule unless given). With 2, the
        batch whose step is computing and the next one, whose lookup the training pipeline may run during
        that step (tierec/train/pipeline.py, stage 3)."""
        keep = self.in_flight if in_flight is None else in_flight
        return hotness.evictable(self.slot_lid, self.pin, clock, score, self.keep, soft=soft, in_flight=keep)

    def coldest(self, clock: int, score: np.ndarray, k: int, soft: bool = False, in_flight: int | None = None,
                uses: tuple[np.ndarray, int, int] | None = None) -> tuple[np.ndarray, int]:
        """(up to ``k`` slots of the lowest ``score`` among those :meth:`evictable` gives, how many may leave: at
        least ``k``, or exact when fewer may; hotness.coldest_evictable); ``uses``: the horizon's next uses,
        which rank rows above their score (Horizon.uses)."""
        keep = self.in_flight if in_flight is None else in_flight
        return hotness.coldest_evictable(self.slot_lid, self.pin, clock, score, self.keep, k, soft=soft, in_flight=keep,
                                         uses=uses, hint=self.next_use)

    def occupied(self) -> np.ndarray:  # lids of the rows in the fast tier
        return self.slot_lid[self.slot_lid >= 0]

    # ------------------------------------------------------------ records

    def columns(self) -> list[tuple[np.ndarray, int]]:
        """The fast tier's arrays as 2-D numpy views with their first column in a record (CPU only)."""
        out, col = [(self.weights.numpy(), 0)], self.dim
        for name, s in self.state.items():
            out.append((s.view(s.shape[0], -1).numpy(), col))
            col += self.state_widths[name]
        return out

    def gather(self, slots: np.ndarray) -> np.ndarray:  # [n, W] records
        slots = slots.astype(np.int64, copy=False)
        if self.device.type == "cpu":
            out = np.empty((slots.size, self.record_width), dtype=np.float32)
            for arr, col in self.columns():
                take_rows(arr, slots, out, col)
            return out
        if slots.size == 0:
            return np.empty((0, self.record_width), dtype=np.float32)
        idx = torch.from_numpy(slots).to(self.device)
        parts = [self.weights.index_select(0, idx)]
        parts += [s.index_select(0, idx).reshape(slots.size, -1) for s in self.state.values()]
        return torch.cat(parts, 1).cpu().numpy()

    def scatter(self, slots: np.ndarray, records: np.ndarray) -> None:
        slots = slots.astype(np.int64, copy=False)
        if self.device.type == "cpu":
            rec = np.ascontiguousarray(records, dtype=np.float32)
            for arr, col in self.columns():
                put_rows(arr, slots, rec, col)
            return
        idx = torch.from_numpy(slots).to(self.device)
        rec = copy_to(torch.from_numpy(np.ascontiguousarray(records)), self.device)  # through pinned memory
        self.weights.index_copy_(0, idx, rec[:, : self.dim].contiguous())
        col = self.dim
        for name, s in self.state.items():
            w = self.state_widths[name]
            s.index_copy_(0, idx, rec[:, col : col + w].reshape(slots.size, *s.shape[1:]).contiguous())
            col += w

    def nbytes(self) -> int:
        total = self.weights.numel() * 4 + sum(t.numel() * 4 for t in self.state.values())
        return (total + self.slot_lid.nbytes + self.pin.nbytes + self.keep.nbytes + self.dirty.nbytes + self.free_slots.nbytes
                + self.next_use.nbytes)


@nb.njit(cache=True, nogil=True)
def _raise_keep(keep, slots, until):
    """``keep[s] = max(keep[s], u)`` for each slot and lookup (slots may repeat: ``np.maximum.at``'s result)."""
    for i in range(slots.shape[0]):
        if until[i] > keep[slots[i]]:
            keep[slots[i]] = until[i]


@nb.njit(cache=True, nogil=True)
def _copy_uses(out, slots, lids, next_at):
    """``out[slots[i]] = next_at[lids[i]]`` (0 for a row past the end of ``next_at``); both ends of pair
    ``i + A`` asked for ahead (a batch's 45k rows: 0.51 against 0.74 ms)."""
    n = next_at.shape[0]
    m = slots.shape[0]
    for i in range(m):
        j = i + AHEAD
        if j < m:
            if 0 <= lids[j] < n:
                prefetch_row(next_at, lids[j])
            prefetch_row(out, slots[j])
        x = lids[i]
        out[slots[i]] = next_at[x] if 0 <= x < n else 0
