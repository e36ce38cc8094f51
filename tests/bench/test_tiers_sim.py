"""The cache simulators of benchmarks.tiers_sim against plain Python references on random traces."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.tiers_sim import belady, next_uses, windowed


def _trace(seed: int, batches: int = 60, n_ids: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = [np.unique(rng.zipf(1.3, size=int(rng.integers(1, 8))) % n_ids) for _ in range(batches)]
    return np.concatenate([[0], np.cumsum([r.size for r in rows])]), np.concatenate(rows)


def _windowed_reference(ptr, ids, capacity: int, window: int) -> int:
    """The same rule written plainly, one victim at a time: evict rows not used in the next ``window`` batches,
    fewest accesses so far first, then those used in it, farthest next use first; ties to the lower id."""
    batches = [list(ids[ptr[b]:ptr[b + 1]]) for b in range(len(ptr) - 1)]
    resident, count, hits = set(), {}, 0
    for b, batch in enumerate(batches):
        misses = [x for x in batch if x not in resident]
        hits += len(batch) - len(misses)
        while len(resident) + len(misses) > capacity:
            def key(x):
                after = [c for c in range(b + 1, len(batches)) if x in batches[c]]
                soon = after[0] if after else None
                if soon is None or soon > b + window:
                    return (0, count.get(x, 0), x)
                return (1, -soon, x)
            resident.remove(min((x for x in resident if x not in batch), key=key))
        resident.update(misses)
        for x in batch:
            count[x] = count.get(x, 0) + 1
    return hits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_windowed_is_belady_with_the_whole_trace_and_its_rule_in_between(seed: int) -> None:
    ptr, ids = _trace(seed)
    nxt = next_uses(ptr, ids, 40)
    full = len(ptr)
    assert windowed(ptr, ids, nxt, 12, 40, full) == belady(ptr, ids, nxt, 12, 40)
    hits = [windowed(ptr, ids, nxt, 12, 40, window) for window in (0, 1, 4, 16)]
    assert hits == [_windowed_reference(ptr, ids, 12, window) for window in (0, 1, 4, 16)]
    assert max(hits) <= belady(ptr, ids, nxt, 12, 40)
