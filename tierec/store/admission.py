"""Admission: which ids never seen before get a row of a tiered group (``store.admit_after``,
``store.admit_probability``); the others read the shared zero row and get no update.

An id is admitted once a count-min sketch has seen it ``admit_after`` times, or by a coin
drawn from a hash of (table, id, seed, step): decided from the access history alone, so a
run's numbers do not depend on where its rows live. With neither set, every id is.

>>> import numpy as np
>>> from tierec.store.spec import TierSpec
>>> a = Admission(TierSpec(cache_bytes=64, admit_after=2), seed=0)
>>> keys, tabs = np.array([7, 8]), np.zeros(2, dtype=np.int32)
>>> a.admit(keys, tabs, step=1).tolist(), a.admit(keys[:1], tabs[:1], step=2).tolist()
([False, False], [True])
"""

from __future__ import annotations

import numpy as np

from tierec.store import hotness
from tierec.store.hotness import CountMinSketch
from tierec.store.spec import TierSpec


class Admission:
    def __init__(self, spec: TierSpec, seed: int) -> None:
        self.after = spec.admit_after
        self.probability = spec.admit_probability
        self.active = spec.admission
        self.seed = seed
        self.sketch = CountMinSketch(spec.sketch_width, spec.sketch_depth, seed) if spec.admit_after > 1 else None

    def admit(self, keys: np.ndarray, tabs: np.ndarray, step: int) -> np.ndarray:
        """[n] bool for unknown (table, id) pairs at training step ``step`` (each sighting is counted)."""
        if not self.active:
            return np.ones(keys.shape[0], dtype=bool)
        admit = np.zeros(keys.shape[0], dtype=bool)
        if self.sketch is not None:
            admit |= self.sketch.add(keys, tabs) >= self.after
        if self.probability < 1.0:
            draw = np.empty(keys.shape[0], dtype=np.float64)
            hotness.coin(keys, tabs.astype(np.int32), self.seed, step, draw)
            admit |= draw < self.probability
        return admit

    def sketch_state(self) -> tuple[np.ndarray | None, int]:
        """(the sketch's counters as int64, or None without a sketch; sightings added since its last halving)."""
        if self.sketch is None:
            return None, 0
        return self.sketch.table.astype(np.int64), self.sketch.added

    def load_sketch(self, table: np.ndarray, added: int) -> None:
        """Counters and sightings from :meth:`sketch_state` (ignored without a sketch)."""
        if self.sketch is not None:
            self.sketch.table[...] = table
            self.sketch.added = added

    def nbytes(self) -> int:
        return self.sketch.nbytes() if self.sketch is not None else 0
