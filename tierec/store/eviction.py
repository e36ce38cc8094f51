"""Eviction: which resident rows leave a tiered group's fast tier when a lookup needs slots.

The lowest scores go (``store.cache_policy``: LFU, the decayed access count; LRU, the step of
last use), never a row pinned by the batch in flight, and rows kept for a later batch of the
read-ahead window only when nothing else is left. Rows the horizon's batches use
(tierec/store/horizon.py) rank above all others, the farthest next use leaving first. Where
they go (host or disk) is the group's.

>>> import numpy as np
>>> from tierec.embedding.layout import RecordLayout
>>> from tierec.embedding.table import TableConfig
>>> from tierec.store.directory import Directory
>>> from tierec.store.fast_tier import FastTier
>>> from tierec.store.horizon import Horizon
>>> from tierec.store.spec import CachePolicy
>>> layout = RecordLayout.of_tables([TableConfig(name="t", dim=2, features=["f"])])
>>> fast, d = FastTier(3, layout, "cpu"), Directory(cache_slots=4)
>>> slots = fast.take(3); fast.slot_lid[slots] = [0, 1, 2]; d.c_freq[slots] = [5.0, 1.0, 3.0]
>>> Eviction(CachePolicy.LFU, Horizon(0)).choose(fast, d, clock=1, wanted=1)[0].tolist()  # the least used
[2]
"""

from __future__ import annotations

import numpy as np

from tierec.store import hotness
from tierec.store.directory import Directory
from tierec.store.fast_tier import FastTier
from tierec.store.horizon import Horizon
from tierec.store.spec import CachePolicy


class Eviction:
    def __init__(self, policy: CachePolicy, horizon: Horizon) -> None:
        self.lfu = policy is CachePolicy.LFU
        self.horizon = horizon  # the store's: next uses of its rows in upcoming batches

    def choose(self, fast: FastTier, index: Directory, clock: int, wanted: int, required: int = 0,
               in_flight: int | None = None, step: int = 0) -> tuple[np.ndarray, int]:
        """(up to ``wanted`` slots to empty, lowest scores first among those that may; how many may leave,
        exact when fewer than ``wanted`` may, else at least ``wanted``): rows kept for the read-ahead window
        may too when fewer than ``required`` others can. ``in_flight``:
        the lookups whose rows stay pinned, when not the fast tier's own rule; ``step``: the training lookups
        so far (the horizon's clock)."""
        score = index.resident_scores(self.lfu)
        uses = self.horizon.uses(step)
        slots, movable = fast.coldest(clock, score, wanted, in_flight=in_flight, uses=uses)
        if movable < required:
            slots, movable = fast.coldest(clock, score, wanted, soft=True, in_flight=in_flight, uses=uses)
        return slots, movable
