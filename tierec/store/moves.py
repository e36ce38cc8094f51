"""TierMoves: the row moves a tiered group lends to the parts it is made of.

A :class:`~tierec.store.tiered_group.TieredGroup` moves rows between its fast tier,
host DRAM and disk. Its hotness pass (:class:`~tierec.store.policies.HotnessPass`)
and its checkpoint records (:class:`~tierec.store.state.TierRecords`) work on
the same parts (directory, tiers, codec) and need a few of those moves; each
gets one ``TierMoves`` with exactly these functions, not the group:

- ``take_slots(n, best_effort)``: ``n`` free fast-tier slots, evicting (with write-back) to make them;
- ``bring_up(lids, slots, loc, home)``: fill ``slots`` with rows ``lids`` from their homes;
- ``free_rows(lids)``: release every tier's slot of rows ``lids``;
- ``read_rows(lids)``: records [n, W] of rows ``lids`` wherever they live;
- ``store_away(lids, records)``: home rows away from every tier in host or disk;
- ``count(counter, tabs)``: add events to the group's per-table counters;
- ``note(keys, tabs)`` / ``note_deleted(keys, tabs)``: change tracking (delta checkpoints);
- ``rehome(lids, slots, since)``: records of rows ``lids`` moved within the disk tier (compaction, begun at
  ``since``): copies read ahead may follow them.

:func:`weakly` makes a function of a bound method that holds its object weakly,
so a group that lends its own methods stays free of reference cycles and is
freed as soon as its last user drops it.

>>> import numpy as np
>>> from tierec.store.moves import TierMoves
>>> seen = []
>>> nothing = lambda *args: None
>>> moves = TierMoves(take_slots=nothing, bring_up=nothing, free_rows=seen.append, read_rows=nothing,
...                   store_away=nothing, count=nothing, note=nothing, note_deleted=nothing, rehome=nothing)
>>> moves.free_rows(np.array([3, 4])); seen
[array([3, 4])]
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tierec.store.spec import Counter


@dataclass(frozen=True)
class TierMoves:
    take_slots: Callable[[int, bool], np.ndarray]
    bring_up: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]
    free_rows: Callable[[np.ndarray], None]
    read_rows: Callable[[np.ndarray], np.ndarray]
    store_away: Callable[[np.ndarray, np.ndarray], None]
    count: Callable[[Counter, np.ndarray], None]
    note: Callable[[np.ndarray, np.ndarray], None]
    note_deleted: Callable[[np.ndarray, np.ndarray], None]
    rehome: Callable[[np.ndarray, np.ndarray, float], None]


def weakly(method: Callable) -> Callable:
    """A function that calls the bound ``method`` without keeping its object alive."""
    ref = weakref.WeakMethod(method)

    def call(*args):
        return ref()(*args)

    return call
